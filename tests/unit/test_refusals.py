"""How a WMS refusal reads on a scan: the cluster it names, the condition, add-workers' answer."""

from __future__ import annotations

import pytest

from skyscan_operator.refusals import (
    CLUSTER_REFUSED,
    WMS_REJECTED,
    named_clusters,
    refused_workers,
    workflow_refusal,
)
from skyscan_operator.wms_client import WMSError, WMSUnavailable

# EWMS (079f9e1) answers an unknown cluster location so: a 400 whose reason names it.
REAL_400 = '{"code": 400, "error": "condor cluster location not found: local"}'


def refusal(detail: str, status: int = 400) -> WMSError:
    return WMSError("POST", "/v1/workflows", status, detail)


def test_the_clusters_a_refusal_names_are_whole_names() -> None:
    clusters = {"osg": "osg", "local": "local", "test-alpha": "x", "test": "t", "a.b": "a.b"}
    assert named_clusters(REAL_400, clusters) == ["local"]
    assert named_clusters("unknown cluster location(s): ['test-alpha', 'local']", clusters) == [
        "local", "test-alpha"
    ]  # fmt: skip
    assert named_clusters("condor cluster location not found: test-alphas", clusters) == []
    assert named_clusters("x: a.bc, localhost, mosg, osg_1", clusters) == []
    assert named_clusters("cluster a.b.", clusters) == ["a.b"]
    assert named_clusters("", clusters) == []


def test_a_refused_workflow_names_the_cluster_as_the_scan_asked_for_it() -> None:
    reason, message = workflow_refusal(refusal(REAL_400), {"osg": "sub-2", "local": "local"})
    assert reason == CLUSTER_REFUSED
    assert message == f"the WMS refused cluster 'local': POST /v1/workflows: HTTP 400: {REAL_400}"
    reason, message = workflow_refusal(refusal("not found: osg"), {"osg": "sub-2"})
    assert reason == CLUSTER_REFUSED
    assert (
        message
        == "the WMS refused cluster 'osg' (asked as 'sub-2'): POST /v1/workflows: HTTP 400: not found: osg"
    )
    two = refusal("unknown cluster location(s): ['local', 'mars']")
    assert workflow_refusal(two, {"local": "local", "mars": "red"})[1] == (
        f"the WMS refused cluster 'local', 'mars' (asked as 'red'): {two}"
    )
    reason, message = workflow_refusal(refusal("Pilot image tag not found."), {"osg": "osg"})
    assert reason == WMS_REJECTED
    assert (
        message
        == "the WMS refused the workflow request: POST /v1/workflows: HTTP 400: Pilot image tag not found."
    )


@pytest.mark.parametrize(
    ("error", "state"),
    [
        (WMSError("POST", "/x", 400, "condor cluster location not found: mars"), "Rejected"),
        (WMSError("POST", "/x", 409, "conflict"), "Rejected"),
        (WMSError("POST", "/x", 422, "workflow is deactivated"), "Refused"),
        (WMSError("POST", "/x", 404, "no task directive"), "Failed"),
        (WMSError("POST", "/x", None, "what"), "Failed"),
        (WMSUnavailable("POST", "/x", 400, "a 400 never cured by a fresh token"), "Failed"),
        (WMSUnavailable("POST", "/x", 503, "down"), "Failed"),
    ],
)
def test_an_add_workers_refusal_is_rest_400_422_or_500(error: WMSError, state: str) -> None:
    got, reason = refused_workers(error, "osg", "osg")
    assert got == state and str(error) in reason


def test_a_rejected_add_workers_names_the_cluster() -> None:
    e = WMSError("POST", "/x", 400, "condor cluster location not found: mars")
    assert refused_workers(e, "mars", "mars") == (
        "Rejected",
        f"the WMS refused workers at cluster 'mars': {e}",
    )
    assert refused_workers(e, "mars", "local")[1].startswith(
        "the WMS refused workers at cluster 'mars' (asked as 'local'): "
    )
    e = WMSError("POST", "/x", 422, "deactivated")
    assert refused_workers(e, "osg", "osg") == (
        "Refused",
        f"the WMS takes no more workers for this workflow: {e}",
    )
