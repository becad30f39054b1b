"""The API surface: OpenAPI vs served routes, response shapes, auth, unknown ids, the cache."""
# ruff: noqa: E501  - request tables read best unwrapped

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel

from api_shim import rest_models
from api_shim.app import CatchAll
from api_shim.routes import ROUTES
from skyscan.io.kube import scan_path
from tests.helpers import eventually
from tests.integration.shim.conftest import ShimUnderTest
from tests.unit.test_crd import minimal_spec

SCAN_ROUTES = [(r.method, r.path) for r in ROUTES if "{scan_id}" in r.path and r.roles]  # public: own tests


async def test_openapi_matches_the_served_routes(shim: ShimUnderTest) -> None:
    reply = await shim.call("GET", "/openapi.json", as_=None)  # public
    assert reply.status == 200
    doc = reply.body
    assert doc["openapi"] == "3.1.0"
    documented = {(method.upper(), path) for path, ops in doc["paths"].items() for method in ops}
    served = {
        (route.method, route.resource.canonical)
        for route in shim.app.router.routes()
        if route.method != "HEAD"
        and route.resource is not None
        and not isinstance(route.resource, CatchAll)
        and not route.resource.canonical.startswith("/ui")
    }  # the catch-all answers only 404 and 405; the dashboard (/ui) is no part of the REST interface
    assert documented == served
    schemas = doc["components"]["schemas"]
    for route in ROUTES:
        op = doc["paths"][route.path][route.method.lower()]
        if route.roles:
            assert {"401", "403"} <= set(op["responses"]) and op["x-roles"] == sorted(route.roles)
        if "{scan_id}" in route.path:
            assert {"404"} & set(op["responses"]) or (
                route.path.endswith("/result") and route.method == "PUT"
            )
        if route.body:
            ref = op["requestBody"]["content"]["application/json"]["schema"]["$ref"]
            assert ref.rsplit("/", 1)[1] in schemas
        if route.redirect:
            assert "302" in op["responses"]
    post_scan = schemas["ScanRequestBody"]
    assert post_scan["additionalProperties"] is False
    assert set(post_scan["required"]) == {
        "docker_tag",
        "reco_algo",
        "nsides",
        "real_or_simulated_event",
        "max_pixel_reco_time",
    }
    assert schemas["Error"]["required"] == ["error", "reason", "message"]


def check(model: type[BaseModel], body: Any) -> None:
    """A response conforms to the model its OpenAPI schema was generated from."""
    model.model_validate(body)


async def test_responses_conform_to_their_models(shim: ShimUnderTest) -> None:
    manifest = await shim.launch()
    scan_id = manifest["scan_id"]
    check(rest_models.Manifest, manifest)
    check(rest_models.ManifestAndResult, (await shim.call("GET", f"/scan/{scan_id}")).body)
    check(rest_models.StatusResponse, (await shim.call("GET", f"/scan/{scan_id}/status")).body)
    check(rest_models.LogsResponse, (await shim.call("GET", f"/scan/{scan_id}/logs")).body)
    check(rest_models.ScanRequestObj, (await shim.call("GET", f"/scan-request/{scan_id}")).body)
    check(rest_models.WorkflowIdResponse, (await shim.call("GET", f"/scan/{scan_id}/wms/workflow-id")).body)
    check(rest_models.Workforce, (await shim.call("GET", f"/scan/{scan_id}/wms/workforce")).body)
    check(rest_models.TaskforcesResponse, (await shim.call("GET", f"/scan/{scan_id}/wms/taskforces")).body)
    check(rest_models.SensorEventResponse, (await shim.call("GET", f"/scan/{scan_id}/sensor-event")).body)
    check(rest_models.BacklogResponse, (await shim.call("GET", "/scans/backlog")).body)
    check(rest_models.FindResponse, (await shim.call("POST", "/scans/find", json_body={"filter": {}})).body)
    result = await shim.call(
        "PUT", f"/scan/{scan_id}/result", as_="system", json_body={"scan_result": {"a": 1}, "is_final": False}
    )
    check(rest_models.Result, result.body)
    check(rest_models.Error, (await shim.call("GET", "/scan/nope")).body)


@pytest.mark.parametrize(("method", "path"), SCAN_ROUTES)
async def test_unknown_ids(shim: ShimUnderTest, method: str, path: str) -> None:
    body: dict[str, Any] | None = None
    if method in ("POST", "PATCH", "PUT", "DELETE"):
        bodies: dict[str, dict[str, Any]] = {
            "/scan/{scan_id}/actions/add-workers": {"n_workers": 1, "cluster_location": "osg"},
            "/scan/{scan_id}/result": {"scan_result": {"a": 1}, "is_final": True},
            "/scan/{scan_id}/wms/workflow-id": {"workflow_id": "w", "wms_address": "a"},
            "/scan/{scan_id}/ewms/workflow-id": {"workflow_id": "w", "ewms_address": "a"},
        }
        body = bodies.get(path, {})
    route = next(r for r in ROUTES if (r.method, r.path) == (method, path))
    role = "user" if "user" in route.roles else "system"  # type: ignore[operator]
    reply = await shim.call(
        method, path.replace("{scan_id}", "0000000000ax4000000000000000000"), as_=role, json_body=body
    )
    expected = (400, "unknown scan") if (method, path) == ("PUT", "/scan/{scan_id}/result") else (404, None)
    assert reply.status == expected[0], reply.body
    assert set(reply.body) == {"error", "reason", "message"}
    if expected[1]:
        assert reply.body["reason"] == expected[1]
    listed = await shim.api.request("GET", scan_path(shim.namespace))
    assert listed["items"] == []  # nothing is ever created by a call on an unknown id


async def test_unknown_paths_and_methods_answer_json(shim: ShimUnderTest) -> None:
    reply = await shim.call("GET", "/nowhere")
    assert reply.status == 404 and reply.body["error"] == "Not Found"
    reply = await shim.call("PUT", "/scans/backlog")
    assert (
        reply.status == 405
        and reply.body["error"] == "Method Not Allowed"
        and "GET" in reply.headers["Allow"]
    )


async def test_authentication_and_roles(shim: ShimUnderTest) -> None:
    scan_id = (await shim.launch())["scan_id"]
    for token in (None, "wrong"):
        for method, path in [
            ("GET", "/"),
            ("GET", f"/scan/{scan_id}"),
            ("POST", "/scan"),
            ("PATCH", f"/scan/{scan_id}/manifest"),
        ]:
            reply = await shim.call(method, path, as_=token, json_body={})
            assert reply.status == 401 and reply.body["reason"] == "authentication failed", (token, path)
            assert reply.body["error"] == "Unauthorized" and reply.headers["WWW-Authenticate"] == "Bearer"
    system_only = [
        ("PATCH", f"/scan/{scan_id}/manifest", {}),
        ("PUT", f"/scan/{scan_id}/result", {"scan_result": {}, "is_final": False}),
        ("POST", f"/scan/{scan_id}/wms/workflow-id", {"workflow_id": "w", "wms_address": "a"}),
    ]
    user_only: list[tuple[str, str, Any]] = [
        ("GET", "/", None), ("POST", "/scans/find", {"filter": {}}), ("GET", "/scans/backlog", None),
        ("POST", "/scan", {}), ("GET", f"/scan-request/{scan_id}", None),
        ("POST", f"/scan/{scan_id}/actions/add-workers", {"n_workers": 1, "cluster_location": "osg"}),
        ("DELETE", f"/scan/{scan_id}", None), ("GET", f"/scan/{scan_id}/result", None), ("GET", f"/scan/{scan_id}/logs", None),
    ]  # fmt: skip
    for role, routes in (("user", system_only), ("system", user_only)):
        for method, path, body in routes:
            reply = await shim.call(method, path, as_=role, json_body=body)
            assert reply.status == 403 and reply.body["reason"] == "authorization failed", (role, path)
    assert (await shim.call("GET", f"/scan/{scan_id}")).body["manifest"][
        "is_deleted"
    ] is False  # nothing happened
    for path in (
        "",
        "/manifest",
        "/status",
        "/sensor-event",
        "/wms/workflow-id",
        "/wms/workforce",
        "/wms/taskforces",
    ):
        for role in ("user", "system"):
            assert (await shim.call("GET", f"/scan/{scan_id}{path}", as_=role)).status == 200, (role, path)


async def test_the_cache_follows_kubectl(shim: ShimUnderTest) -> None:
    name = "0194d2a3b4cx4a1b2c3d4e5f6a7b8c9d0"
    await shim.api.request(
        "POST",
        scan_path(shim.namespace),
        body={
            "apiVersion": "skyscan.io/v1alpha1",
            "kind": "Scan",
            "metadata": {"name": name},
            "spec": minimal_spec(),
        },
    )

    async def visible() -> Any:
        reply = await shim.call("GET", f"/scan/{name}/manifest")
        return reply.body if reply.status == 200 else None

    manifest = await eventually(visible, timeout=10)
    created = (await shim.api.request("GET", scan_path(shim.namespace, name)))["metadata"]
    assert manifest["timestamp"] > 1.7e9 and created["creationTimestamp"]  # from creationTimestamp
    await shim.api.request("DELETE", scan_path(shim.namespace, name))

    async def gone() -> bool:
        return (await shim.call("GET", f"/scan/{name}/manifest")).status == 404

    assert await eventually(gone, timeout=10)


async def test_reads_survive_an_unreachable_api_server_and_writes_answer_503_without_the_drivers_words(
    shim: ShimUnderTest,
) -> None:
    scan_id = (await shim.launch())["scan_id"]
    shim.state.scans._api.server = "https://127.0.0.1:9"  # nothing listens there
    shim.state.scans._store._timeout = 2.0
    assert (await shim.call("GET", f"/scan/{scan_id}/manifest")).status == 200
    assert (await shim.call("POST", "/scans/find", json_body={"filter": {}})).body["manifests"][0][
        "scan_id"
    ] == scan_id
    for method, path, body in [
        ("POST", "/scan", None),
        ("DELETE", f"/scan/{scan_id}", {}),
        ("PATCH", f"/scan/{scan_id}/manifest", {"scan_metadata": {"a": 1}}),
    ]:
        from tests.integration.shim.conftest import scan_body

        reply = await shim.call(
            method,
            path,
            json_body=body if body is not None else scan_body(),
            as_="system" if method == "PATCH" else "user",
        )
        assert reply.status == 503 and reply.body["reason"] == "kubernetes API unavailable", (
            path,
            reply.body,
        )
        assert reply.body["message"] == "The API server did not answer; try again.", reply.body  # no repr
    assert (await shim.call("GET", f"/scan/{scan_id}")).body["manifest"]["is_deleted"] is False


async def test_a_compacted_watch_position_means_relist(shim: ShimUnderTest) -> None:
    """The API server answers a watch from a resourceVersion it no longer holds with 410 Gone."""
    from api_shim.repository.cache import ScanCache
    from skyscan.io.kube_errors import Gone

    cache = ScanCache(shim.state.scans._api, shim.namespace)
    cache.resource_version = "1"
    with pytest.raises(Gone):
        await cache._watch()
    await cache._relist()
    assert cache.synced.is_set() and int(cache.resource_version) > 1
