"""Request validation wording, query booleans, redirect locations, tokens, watch events."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import make_mocked_request
from pydantic import BaseModel, ValidationError

from api_shim import auth, rest_models
from api_shim.app import create_app, redirect_location
from api_shim.errors import ApiError
from api_shim.metrics import UNMATCHED, template
from api_shim.plumbing import parse_bool
from api_shim.repository.cache import Gone, ScanCache
from api_shim.routes import ROUTES
from api_shim.settings import ShimSettings
from skyscan.io.kube_errors import KubeError
from skyscan.model import Integer
from skyscan.scan_record import compact


def reason(model: type[BaseModel], body: dict[str, Any]) -> str:
    with pytest.raises(ValidationError) as e:
        model.model_validate_json(json.dumps(body))
    return rest_models.validation_reason(e.value)


def test_missing_and_unexpected_fields() -> None:
    assert reason(rest_models.PutResultBody, {}) == (
        "'scan_result' is a required property; 'is_final' is a required property"
    )
    assert reason(rest_models.PutResultBody, {"scan_result": [], "is_final": True}) == (
        "'scan_result': must be type 'object' (dict)"
    )
    assert reason(rest_models.FindBody, {"filter": {}, "x": 1, "a": 2}) == (
        "Additional properties are not allowed ('a', 'x' were unexpected)"
    )
    assert reason(rest_models.AddWorkersBody, {"n_workers": 0, "cluster_location": ""}) == (
        "'n_workers': must be at least 1; 'cluster_location': must be at least 1 characters long"
    )
    assert reason(rest_models.PatchManifestBody, {"progress": {"summary": "s"}}).startswith(
        "'progress': 'epilogue' is a required property"
    )
    assert (
        reason(rest_models.RescanBody, {"no_redirect": "yes"})
        == "'no_redirect': must be type 'boolean' (bool)"
    )


def test_integral_numbers_are_integers_and_integers_are_bounded() -> None:
    """JSON Schema's integers: 91.0 is one (taken as 91); 91.5, booleans and strings are not."""
    body = rest_models.AddWorkersBody.model_validate_json('{"n_workers": 91.0, "cluster_location": "osg"}')
    assert body.n_workers == 91 and type(body.n_workers) is int
    for value in ("91.5", "true", '"91"', "1e400"):
        assert reason(
            rest_models.AddWorkersBody, {"cluster_location": "osg", "n_workers": json.loads(value)}
        ) == ("'n_workers': must be type 'integer' (int)"), value
    for value in (100_001, 2**70, 1e300):  # a hundred thousand workers per request, not any int64
        assert reason(rest_models.AddWorkersBody, {"n_workers": value, "cluster_location": "osg"}) == (
            "'n_workers': must be no more than 100000"
        )
    assert rest_models.AddWorkersBody.model_validate({"n_workers": 100_000, "cluster_location": "osg"})
    for value in (2**70, 1e300, 2**63 - 1):  # the CRD's bound: the largest int64 a float64 states exactly
        assert reason(Priority, {"priority": value}) == "'priority': must be no more than 9223372036854774784"


class Priority(rest_models.Body):
    priority: Integer


def test_integers_beyond_int64_in_free_form_fields_are_refused_not_rounded() -> None:
    """A scalar map takes a number as an int or a float: 2**70 would have become a float, rounded."""
    for field in ("classifiers", "scanner_server_env_from_user"):
        got = reason(rest_models.ScanRequestBody, {field: {"SKYSCAN_A": 2**70}})
        assert f"'{field}.SKYSCAN_A': integers are at most 9223372036854774784" in got, got
    assert "classifiers" not in reason(
        rest_models.ScanRequestBody, {"classifiers": {"a": 2**62, "b": 1.5e300}}
    )


def test_numbers_are_finite() -> None:
    result = {"scan_result": {"a": {"b": [1, float("nan")]}}, "is_final": True}
    assert reason(rest_models.PutResultBody, result) == (
        "'scan_result': must not contain NaN or an infinite number (JSON has neither)"
    )
    assert reason(rest_models.FindBody, {"filter": {"x": float("-inf")}}) == (
        "'filter': must not contain NaN or an infinite number (JSON has neither)"
    )


def test_manifest_fields_have_a_size_limit() -> None:
    limit = rest_models.MANIFEST_FIELD_MAX_BYTES
    fits = rest_models.PatchManifestBody.model_validate({"scan_metadata": {"k": "x" * (limit - 20)}})
    assert fits.oversized() is None
    over = rest_models.PatchManifestBody.model_validate({"scan_metadata": {"k": "é" * (limit // 2)}})
    assert over.oversized() == ("scan_metadata", len('{"k":""}') + limit)  # UTF-8 bytes, not characters


@pytest.mark.parametrize(("text", "value"), [("true", True), ("TRUE", True), ("1", True), ("Yes", True),
                                             ("false", False), ("0", False), ("NO", False)])  # fmt: skip
def test_query_booleans(text: str, value: bool) -> None:
    assert parse_bool("include_deleted", text) is value


def test_bad_query_boolean() -> None:
    with pytest.raises(ApiError) as e:
        parse_bool("include_deleted", "maybe")
    assert e.value.status == 400 and "include_deleted" in e.value.reason


def test_redirect_location_keeps_the_query_and_never_a_client_named_host() -> None:
    request = make_mocked_request(
        "GET", "/scan/old1/manifest?projection=a|b&no_redirect=false", headers={"Host": "shim:8080"}
    )
    expected = "/scan/new2/manifest?projection=a%7Cb&no_redirect=false"
    assert redirect_location(request, "old1", "new2") == expected
    forwarded = make_mocked_request(
        "GET",
        "/scan/old1",
        headers={"Host": "internal", "X-Forwarded-Proto": "https", "X-Forwarded-Host": "api.example"},
    )
    assert redirect_location(forwarded, "old1", "new2") == "/scan/new2"


async def test_static_tokens(tmp_path: Path) -> None:
    path = tmp_path / "tokens.json"
    token = auth.make_token(path, "alice", ["user", "system"])
    assert token not in path.read_text()  # only its hash is stored
    tokens = auth.StaticTokens.load(path)
    assert await auth.identify([tokens], f"Bearer {token}") == auth.Identity(
        "alice", frozenset({"user", "system"})
    )
    assert await auth.identify([tokens], "Bearer nope") is None
    assert await auth.identify([tokens], None) is None
    with pytest.raises(ValueError, match="unknown roles"):
        auth.make_token(path, "bob", ["admin"])


async def test_watch_events_update_the_cache() -> None:
    cache = ScanCache(None, "ns")  # type: ignore[arg-type]  # no API calls in this test

    def scan(name: str, rv: int, **spec: str) -> dict[str, Any]:
        return {"metadata": {"name": name, "resourceVersion": str(rv)}, "spec": spec}

    cache._apply({"type": "ADDED", "object": scan("a", 5)})
    cache._apply({"type": "ADDED", "object": scan("b", 6, rescanOf="a")})
    cache._apply({"type": "ADDED", "object": scan("c", 7, rescanOf="b")})
    assert cache.rescan_ids("a") == ["b", "c"] and cache.resource_version == "7"
    waiting = {**scan("b", 8, rescanOf="a"), "status": {"backlog": {"enteredAt": 1.0}}}
    cache._apply({"type": "MODIFIED", "object": waiting})
    assert cache.backlog() == [compact(waiting)]  # held compact: apiVersion and kind filled in
    cache._apply({"type": "MODIFIED", "object": scan("b", 9, rescanOf="a")})
    assert cache.backlog() == []
    cache.observe(scan("a", 4))  # an older copy (a late write response) loses
    assert cache.get("a") == compact(scan("a", 5))
    cache._apply({"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "9"}}})
    assert cache.resource_version == "9"
    cache._apply({"type": "DELETED", "object": scan("c", 10, rescanOf="b")})
    cache.observe(scan("c", 8, rescanOf="b"))  # a write that returned before the deletion
    assert cache.get("c") is None and cache.rescan_ids("a") == ["b"] and cache.resource_version == "10"
    with pytest.raises(Gone):
        cache._apply({"type": "ERROR", "object": {"code": 410, "message": "too old resource version"}})
    # A restarting API server may answer a watch with a bare Status: a reconnect, not a KeyError.
    with pytest.raises(KubeError) as unavailable:
        cache._apply({"kind": "Status", "code": 503, "message": "the server is shutting down"})
    assert unavailable.value.status == 503 and cache.resource_version == "10"


def test_cli_makes_tokens_and_prints_the_openapi_document(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from api_shim.app import main

    assert main(["make-token", "--file", str(tmp_path / "t.json"), "--name", "ci", "--roles", "system"]) == 0
    token = capsys.readouterr().out.strip()
    assert auth.token_hash(token) in json.loads((tmp_path / "t.json").read_text())
    assert main(["openapi"]) == 0
    assert json.loads(capsys.readouterr().out)["openapi"] == "3.1.0"


async def test_the_polled_reads_are_routed_first_and_each_path_is_one_resource() -> None:
    app = await create_app(ShimSettings(auth_disabled=True))
    *paths, last = [template(resource) for resource in app.router.resources()]
    assert paths[:2] == ["/scan/{scan_id}/status", "/scan/{scan_id}/manifest"]
    # A path's methods share its resource, whose template is the route's (its metrics' label); the
    # dashboard's files and login come after the REST interface's routes.
    interface, ui = paths[:-6], paths[-6:]
    assert sorted(interface) == sorted({route.path for route in ROUTES})
    assert ui == ["/ui", "/ui/", "/ui/session", "/ui/config", "/ui/{name}", "/ui/login"]
    assert last == UNMATCHED  # the catch-all, last
