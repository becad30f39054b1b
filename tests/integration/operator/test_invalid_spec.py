"""A Scan made directly through the API server (as kubectl makes it) is held by the operator to the rules
REST holds a request to: one that breaks one is Failed/InvalidSpec, its condition and a Warning Event
naming the field, and nothing is started for it (no WMS workflow, no credential, no Job)."""

from __future__ import annotations

from typing import Any

from skyscan import names
from skyscan.io.kube import Kube, core_path, path
from tests.integration.operator.conftest import (
    OperatorFactory,
    Simulator,
    condition,
    create_scan,
    get_scan,
    scan_events,
    st,
    wait_scan,
)


def invalid(scan: dict[str, Any]) -> bool:
    return condition(scan, "Failed").get("reason") == "InvalidSpec"


async def nothing_started(api: Kube, wms: Simulator, namespace: str, name: str) -> None:
    scan = await get_scan(api, namespace, name)
    jobs = await api.request("GET", path("batch/v1", "jobs", namespace))
    assert names.job_name(name) not in {j["metadata"]["name"] for j in jobs["items"]}
    secrets = await api.request("GET", core_path("secrets", namespace))
    assert not {s["metadata"]["name"] for s in secrets["items"]} & {
        names.scanner_token_secret_name(name),
        names.wms_secret_name(name),
    }
    assert await wms.workflows(marker=scan["metadata"]["uid"]) == []
    assert not st(scan).get("job") and not st(scan).get("workflow") and not st(scan).get("scannerCredential")


async def test_a_kubectl_scan_with_an_unlisted_tag_fails_naming_the_field_and_no_job_is_made(
    api: Kube, namespace: str, operator: OperatorFactory, wms: Simulator
) -> None:
    operator()
    dev = await create_scan(api, namespace, dockerTag="dev")  # REST refuses it: not in the catalog
    digest = await create_scan(api, namespace, dockerTag="4.1.2@sha256:" + "a" * 64)
    valid = await create_scan(api, namespace)  # the same but for its listed tag

    for name, says in ((dev, "'dev' is not a tag of the catalog"), (digest, "no '@', ':' or '/'")):
        scan = await wait_scan(api, namespace, name, invalid)
        failed = condition(scan, "Failed")
        assert failed["status"] == "True" and failed["message"].startswith("spec.dockerTag: ")
        assert says in failed["message"]
        assert condition(scan, "Stalled")["reason"] == "InvalidSpec"  # kubectl describe, GitOps: failed
        assert st(scan)["state"] == "ABORTED__PRESTARTUP" and not st(scan).get("backlog")
        await scan_events(api, namespace, name, "InvalidSpec")
    # The valid scan gets its Job: by then the invalid ones, planned long before, still have none.
    await wait_scan(api, namespace, valid, lambda s: st(s).get("job"))
    for name in (dev, digest):
        await nothing_started(api, wms, namespace, name)


async def test_a_kubectl_scan_with_a_reserved_key_fails_naming_the_field(
    api: Kube, namespace: str, operator: OperatorFactory, wms: Simulator
) -> None:
    operator()
    cases = {
        await create_scan(api, namespace, classifiers={"rescan": True}): "spec.classifiers: ",
        await create_scan(
            api, namespace, scannerServerEnvFromUser={"SKYSCAN_EWMS_JSON": "/tmp/mine.json"}
        ): "spec.scannerServerEnvFromUser: cannot set 'SKYSCAN_EWMS_JSON'",
        await create_scan(
            api, namespace, scannerServerEnvFromUser={"HTTPS_PROXY": "http://evil:3128"}
        ): "spec.scannerServerEnvFromUser[HTTPS_PROXY]: not on the scanner's env allow-list",
        # A key the CRD schema cannot see and the model cannot read even leniently.
        await create_scan(api, namespace, classifiers={"k" * 26: 1}): f"spec.classifiers[{'k' * 26}]: ",
    }
    valid = await create_scan(api, namespace)
    for name, says in cases.items():
        scan = await wait_scan(api, namespace, name, invalid)
        assert condition(scan, "Failed")["message"].startswith(says), condition(scan, "Failed")
        await scan_events(api, namespace, name, "InvalidSpec")
    await wait_scan(api, namespace, valid, lambda s: st(s).get("job"))
    for name in cases:
        await nothing_started(api, wms, namespace, name)
