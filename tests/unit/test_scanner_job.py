"""Pure builders: the scanner args, the Job, the Secret and the WMS workflow request."""

from __future__ import annotations

import pytest

from skyscan import model, names
from skyscan.scanner_args import scanner_server_args
from skyscan_local.wms_simulator import SimError, validate_workflow_request
from skyscan_operator import scanner_job
from skyscan_operator.settings import OperatorSettings
from tests.unit.test_crd import minimal_spec

S = OperatorSettings(rest_address="http://shim:8080", wms_address="http://wms:8081")


def spec(**changes: object) -> model.ScanSpec:
    return model.ScanSpec.model_validate(minimal_spec(**changes))


def test_scanner_server_args_are_the_reference_string() -> None:
    got = scanner_server_args(spec(recoAlgo="anything", nsides={"1": 2, "3": 4}))
    assert got == (
        "python -m skymap_scanner.server  --reco-algo anything --cache-dir /common-space  "
        "--client-startup-json /common-space/startup.json  --nsides 1:2 3:4  --real-event  "
        "--predictive-scanning-threshold 1.0 "
    )
    assert "--simulated-event" in scanner_server_args(spec(realOrSimulatedEvent="sim"))


def test_skyscans_own_scanner_env_wins_over_the_users() -> None:
    # A Scan made with kubectl skips the REST validation; its spec is read as stored.
    stored = minimal_spec(scannerServerEnvFromUser={
        "SKYSCAN_SKYDRIVER_ADDRESS": "http://127.0.0.1:9999", "SKYSCAN_SKYDRIVER_AUTH": "mine",
        "PYTHONSTARTUP": "/tmp/x.py", "SKYSCAN_PROGRESS_INTERVAL_SEC": 30,
    })  # fmt: skip
    with pytest.raises(ValueError, match="cannot set 'SKYSCAN_SKYDRIVER_ADDRESS'"):
        model.ScanSpec.model_validate(stored)  # refused on the way in
    as_stored = model.ScanSpec.model_validate(stored, context=model.STORED)
    job = scanner_job.build_job("abc", "uid-1", "ns", as_stored, S)
    env = job["spec"]["template"]["spec"]["containers"][0]["env"]
    by_name = {e["name"]: e for e in env}
    assert len(by_name) == len(env)  # one entry each
    assert by_name["SKYSCAN_SKYDRIVER_ADDRESS"]["value"] == "http://shim:8080"
    assert by_name["SKYSCAN_SKYDRIVER_AUTH"].get("value") != "mine"
    assert "PYTHONSTARTUP" not in by_name
    assert by_name["SKYSCAN_PROGRESS_INTERVAL_SEC"]["value"] == "30"  # the scanner's tuning stays the user's


def test_job_has_the_reference_shape() -> None:
    job = scanner_job.build_job("abc", "uid-1", "ns", spec(scannerServerMemoryBytes=2_000_000_000), S)
    assert job["metadata"]["name"] == "skyscan-abc"
    assert job["metadata"]["labels"]["skyscan.io/scan-id"] == "abc"
    assert job["metadata"]["annotations"] == {"argocd.argoproj.io/sync-options": "Prune=false"}
    assert job["metadata"]["ownerReferences"] == [names.owner_reference("abc", "uid-1")]
    assert job["metadata"]["ownerReferences"][0]["controller"] is True
    js = job["spec"]
    assert (js["backoffLimit"], js["activeDeadlineSeconds"], js["ttlSecondsAfterFinished"]) == (
        0,
        172800,
        600,
    )
    pod = js["template"]["spec"]
    assert pod["restartPolicy"] == "Never"
    # Its own account with no bindings, no API token mounted.
    assert pod["serviceAccountName"] == "skyscan-scanner" and pod["automountServiceAccountToken"] is False
    (container,) = pod["containers"]
    assert container["image"] == "icecube/skymap_scanner:4.1.2"
    assert container["resources"] == {
        "limits": {"memory": "2000000000", "cpu": "1.0"},
        "requests": {"memory": "2000000000", "cpu": "0.1", "ephemeral-storage": "8G"},
    }
    assert {"name": "ewms", "secret": {"secretName": "skyscan-abc-ewms"}} in pod["volumes"]


def test_user_env_comes_first_as_strings() -> None:
    env_from_user = {"FLAG": True, "NOTHING": None, "N": 3}
    job = scanner_job.build_job("abc", "u", "ns", spec(scannerServerEnvFromUser=env_from_user), S)
    env = job["spec"]["template"]["spec"]["containers"][0]["env"]
    names = [e["name"] for e in env]
    assert names[:4] == ["FLAG", "NOTHING", "N", "SKYSCAN_EWMS_JSON"]
    values = {e["name"]: e.get("value") for e in env}
    assert (values["FLAG"], values["NOTHING"], values["N"]) == ("True", "None", "3")


def test_each_scanner_reads_its_own_token() -> None:
    s = S.model_copy(update={"scanner_pod_annotations": {"a": "b"}})
    job = scanner_job.build_job("abc", "u", "ns", spec(), s)
    assert job["spec"]["template"]["metadata"]["annotations"] == {"a": "b"}
    env = {e["name"]: e for e in job["spec"]["template"]["spec"]["containers"][0]["env"]}
    secret = {"name": "skyscan-abc-scanner", "key": "token"}
    assert env["SKYSCAN_SKYDRIVER_AUTH"]["valueFrom"] == {"secretKeyRef": secret}
    assert names.scan_id_of_scanner_secret(secret["name"]) == "abc"
    assert names.scan_id_of_scanner_secret("skyscan-abc-ewms") is None


def test_the_token_request_is_bound_to_the_scans_secret() -> None:
    body = scanner_job.token_request("skyscan-abc-scanner", "uid-9", scanner_job.credential_lifetime(S))
    assert body["spec"]["audiences"] == ["skyscan-scanner"]
    assert body["spec"]["boundObjectRef"] == {
        "apiVersion": "v1", "kind": "Secret", "name": "skyscan-abc-scanner", "uid": "uid-9"
    }  # fmt: skip
    assert body["spec"]["expirationSeconds"] > S.job_active_deadline_seconds
    secret = scanner_job.credential_secret("abc", "uid-1", "ns")
    assert secret["metadata"]["ownerReferences"] == [names.owner_reference("abc", "uid-1")]
    assert "data" not in secret and "stringData" not in secret  # the token is added once issued


def test_workflow_request_follows_the_reference_and_passes_wms_validation() -> None:
    clusters = [
        {"location": "sub-2", "nWorkers": 4},
        {"location": "osg", "nWorkers": 9},
        {"location": "osg", "nWorkers": 1},
    ]
    body = scanner_job.workflow_request(
        "abc", "uid-1", spec(requestClusters=clusters, debugMode=["client-logs"]), S
    )
    validate_workflow_request(body, {"osg", "sub-2"})
    (task,) = body["tasks"]
    assert task["cluster_locations"] == ["sub-2", "osg"]  # the WMS rejects duplicates
    assert task["n_workers"] == 4  # the first cluster's count, as the reference does
    env = task["pilot_config"]["environment"]
    assert env["EWMS_PILOT_TASK_TIMEOUT"] == 600 and env["EWMS_PILOT_DUMP_TASK_OUTPUT"] == "True"
    assert env["SKYSCAN_REQUEST_ID"] == "uid-1"
    assert "http://shim:8080/scan/abc/startup.json" in task["init_args"]
    assert task["task_image"].endswith("skymap_scanner:4.1.2")


def test_the_wms_double_rejects_what_the_real_one_rejects() -> None:
    body = scanner_job.workflow_request("abc", "u", spec(), S)
    body["tasks"][0]["pilot_config"]["environment"]["EWMS_PILOT_TASK_IMAGE"] = "x"
    with pytest.raises(SimError, match="EWMS_PILOT_TASK_IMAGE"):
        validate_workflow_request(body, {"osg"})
    with pytest.raises(SimError, match="unknown cluster"):
        validate_workflow_request(scanner_job.workflow_request("abc", "u", spec(), S), {"local"})
    with pytest.raises(SimError, match="additional properties"):
        validate_workflow_request({**scanner_job.workflow_request("abc", "u", spec(), S), "x": 1}, {"osg"})


def test_ewms_connection_waits_for_activation() -> None:
    profiles = [
        {"alias": "to-client-queue", "mqid": "a1", "is_activated": True}
        | {"auth_token": "t", "broker_type": "r", "broker_address": "b"},
        {"alias": "from-client-queue", "mqid": "a2", "is_activated": False}
        | {"auth_token": None, "broker_type": None, "broker_address": None},
    ]
    assert scanner_job.ewms_connection(profiles) is None
    profiles[1].update(is_activated=True, auth_token="u", broker_type="r", broker_address="b")
    got = scanner_job.ewms_connection(profiles)
    assert got == {
        "toclient": {"name": "a1", "auth_token": "t", "broker_type": "r", "broker_address": "b"},
        "fromclient": {"name": "a2", "auth_token": "u", "broker_type": "r", "broker_address": "b"},
    }
