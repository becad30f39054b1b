"""The rules a stored Scan spec is held to (`skyscan.policy`, `skyscan.tags.check_tag`): what REST would
refuse, the operator refuses in a Scan made with kubectl, naming the field; what REST stores passes."""

from __future__ import annotations

import json
from typing import Any

import pytest

from api_shim.launch import Defaults, normalise
from api_shim.rest_models import ScanRequestBody
from skyscan import policy
from skyscan.tags import TagError, check_tag
from tests.unit.test_crd import minimal_spec

CATALOG = frozenset({"3.4.0", "4.0.0", "4.1.2", "4.2.1", "dev-branch-abc1234"})
POLICY = policy.Policy(
    tags=CATALOG,
    min_tag="4.0.0",
    scanner_env_allowed=frozenset({"OMP_*"}),
    known_clusters={"osg": 100, "sub-2": None},
    max_n_workers=1000,
)


@pytest.mark.parametrize("tag", ["4.0.0", "4.1.2", "4.2.1", "dev-branch-abc1234"])
def test_a_listed_tag_at_or_above_the_minimum_passes(tag: str) -> None:
    check_tag(tag, CATALOG, "4.0.0")


@pytest.mark.parametrize(
    ("tag", "why"),
    [
        ("dev", "not a tag of the catalog"),
        ("4.2.1@sha256:abc", "no '@', ':' or '/'"),  # a digest: the kubelet would pull by it
        ("a/b:c", "no '@', ':' or '/'"),  # another image
        ("4.2.1:x", "no '@', ':' or '/'"),
        ("4.9.9", "not a tag of the catalog"),  # a semver tag nobody listed
        ("3.4.0", "older than the minimum supported tag 'v4.0.0'"),  # listed, but below the minimum
        ("latest", "not a tag of the catalog"),  # REST resolves it before storing: never stored as is
        ("4.2", "not a tag of the catalog"),
        ("v4.2.1", "not a tag of the catalog"),  # REST strips the v
        (" 4.2.1", "not a tag of the catalog"),
    ],
)
def test_a_tag_rest_would_not_store_is_refused(tag: str, why: str) -> None:
    with pytest.raises(TagError, match=why.replace("(", r"\(").replace(")", r"\)")):
        check_tag(tag, CATALOG, "4.0.0")


def test_a_listed_tag_that_looks_like_a_digest_is_still_refused() -> None:
    with pytest.raises(TagError):
        check_tag("4.2.1@sha256:abc", {"4.2.1@sha256:abc"}, "4.0.0")


def test_a_valid_spec_passes() -> None:
    assert policy.refusal(minimal_spec(), POLICY) is None
    allowed = minimal_spec(scannerServerEnvFromUser={"OMP_NUM_THREADS": 2, "SKYSCAN_LOG": "DEBUG"})
    assert policy.refusal(allowed, POLICY) is None


@pytest.mark.parametrize(
    ("changes", "field", "says"),
    [
        ({"dockerTag": "dev"}, "spec.dockerTag", "'dev' is not a tag of the catalog"),
        ({"dockerTag": "4.2.1@sha256:abc"}, "spec.dockerTag", "no '@', ':' or '/'"),
        ({"dockerTag": "3.4.0"}, "spec.dockerTag", "older than the minimum"),
        ({"classifiers": {"rescan": True}}, "spec.classifiers", "cannot contain 'rescan'"),
        ({"classifiers": {"origin_scan_id": "x"}}, "spec.classifiers", "cannot contain 'origin_scan_id'"),
        ({"classifiers": {"k" * 26: 1}}, f"spec.classifiers[{'k' * 26}]", "at most 25 characters"),
        ({"scannerServerEnvFromUser": {"SKYSCAN_EWMS_JSON": "/x"}}, "spec.scannerServerEnvFromUser",
         "cannot set 'SKYSCAN_EWMS_JSON'"),
        ({"scannerServerEnvFromUser": {"HTTPS_PROXY": "http://evil"}},
         "spec.scannerServerEnvFromUser[HTTPS_PROXY]", "not on the scanner's env allow-list"),
        ({"scannerServerEnvFromUser": {"A B": "x"}}, "spec.scannerServerEnvFromUser[A B]", "match pattern"),
        ({"sensorEventId": "x/../../secrets/y"}, "spec.sensorEventId", "not a sensor event id"),
        ({"sensorEventId": "e" * 49}, "spec.sensorEventId", "at most 48"),
        ({"requestClusters": [{"location": "osg", "nWorkers": 1}, {"location": "mars", "nWorkers": 1}]},
         "spec.requestClusters[1].location", "unknown cluster 'mars' (available: osg, sub-2)"),
        ({"requestClusters": [{"location": "osg", "nWorkers": 1001}]}, "spec.requestClusters[0].nWorkers",
         "no more than 1000 (SKYSCAN_MAX_N_WORKERS)"),
        ({"requestClusters": [{"location": "osg", "nWorkers": 101}], "debugMode": ["client-logs"]},
         "spec.requestClusters[0].nWorkers", "no more than 100: cluster 'osg' with debugMode client-logs"),
        ({"requestClusters": [{"location": "osg", "nWorkers": 0}]}, "spec.requestClusters[0].nWorkers",
         "greater than or equal to 1"),
        ({"recoAlgo": "a b"}, "spec.recoAlgo", "match pattern"),
    ],
)  # fmt: skip
def test_a_refusal_names_the_field(changes: dict[str, Any], field: str, says: str) -> None:
    refusal = policy.refusal(minimal_spec(**changes), POLICY)
    assert refusal is not None and refusal.field == field, refusal
    assert says in refusal.message and str(refusal).startswith(f"{field}: ")


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"dockerTag": "dev"}, "'dev' is not a tag of the catalog (SKYSCAN_TAGS, SKYSCAN_TAG_CATALOG_DIR); "
                               "a scan names one of its tags exactly"),
        ({"classifiers": {"rescan": True}}, "classifier cannot contain 'rescan' sub-field"),
        ({"scannerServerEnvFromUser": {"HTTPS_PROXY": "x"}},
         "not on the scanner's env allow-list (its tuning variables and SKYSCAN_SCANNER_ENV_ALLOWED)"),
    ],
)  # fmt: skip
def test_a_refusal_says_why_in_full(changes: dict[str, Any], message: str) -> None:
    """The whole message a condition shows: pydantic's "Value error, " prefix dropped, the settings named."""
    refusal = policy.refusal(minimal_spec(**changes), POLICY)
    assert refusal is not None and refusal.message == message


def test_a_sensor_event_id_of_the_longest_length_passes() -> None:
    longest = "e" * policy.model.SENSOR_EVENT_ID_MAX_LENGTH
    assert policy.refusal(minimal_spec(sensorEventId=longest), POLICY) is None


def test_client_logs_caps_only_capped_clusters() -> None:
    uncapped = minimal_spec(
        requestClusters=[{"location": "sub-2", "nWorkers": 900}], debugMode=["client-logs"]
    )
    assert policy.refusal(uncapped, POLICY) is None


def test_what_rest_stores_passes() -> None:
    """A request the shim takes (its tag resolved, its sizes normalised) is stored in a form the
    operator's check passes: the two never disagree on a REST-made scan."""
    defaults = Defaults("1G", "8GB", "1GB", POLICY.known_clusters, POLICY.min_tag, frozenset({"OMP_*"}), 1000)
    for tag in ("latest", "4", "v4.1", "4.2.1", "dev-branch-abc1234"):
        body = ScanRequestBody.model_validate_json(
            json.dumps({
                "docker_tag": tag, "reco_algo": "millipede_wilks", "sensor_event_id": "0123abc",
                "nsides": {"8": 0}, "real_or_simulated_event": "real", "max_pixel_reco_time": 60,
                "request_clusters": [["osg", 100], ["sub-2", 1000]], "debug_mode": "client-logs",
                "classifiers": {"a": 1}, "scanner_server_env_from_user": {"OMP_NUM_THREADS": 4},
            })
        )  # fmt: skip
        spec = normalise(body, CATALOG, defaults).spec
        assert policy.refusal(spec.to_kube(), POLICY) is None, tag


def test_the_settings_give_the_policy_their_values_and_the_catalog_as_it_is() -> None:
    settings = policy.PolicySettings(
        min_tag="4.1.0", scanner_env_allowed=["OMP_*"], known_clusters={"osg": 3}, max_n_workers=5
    )
    assert settings.request_policy(CATALOG) == policy.Policy(
        tags=CATALOG,
        min_tag="4.1.0",
        scanner_env_allowed=["OMP_*"],
        known_clusters={"osg": 3},
        max_n_workers=5,
    )
