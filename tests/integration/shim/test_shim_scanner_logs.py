"""Scanner logs that outlive their Pods (issue 32, item 3), on the real API server, the shim over HTTP
and a real PostgreSQL: the operator's `LogKeeper` keeps an ended scanner's log once, its head and tail
cut at the configured size with the marker; the shim serves it after the Pod is gone and after the
scan is archived, to users and viewers only; the Pod a Scan's status names is read only if it is that
scan's own. The kwok node runs no containers and serves no logs (the API server answers 500 for
them): here the kubelet's answer alone is played (`Kubelet`), everything else is real; the real node
(tests/e2e/test_real_stack.py) reads real logs."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator
from typing import Any

import pytest

from api_shim.handlers.scanner_log import CONTAINER_GONE
from skyscan import conditions as cond
from skyscan import names
from skyscan.io import kube, payloads
from skyscan.io.kube import Kube
from skyscan.io.kube_errors import NotFound
from skyscan_client import cli as skyscan
from skyscan_client import exit_codes
from skyscan_operator.archiver import Archiver
from skyscan_operator.log_keeper import LogKeeper, ended
from skyscan_operator.settings import OperatorSettings
from tests.helpers import eventually
from tests.integration.shim.conftest import MakeShim, ShimUnderTest

pytestmark = pytest.mark.timeout(120)
MiB = 2**20
OOM = {
    "reason": "OOMKilled",
    "exitCode": 137,
    "startedAt": "2026-11-28T10:00:00Z",
    "finishedAt": "2026-11-28T10:00:09Z",
}
ENDING = b"[skyscan: the scanner container ended: OOMKilled, exit code 137, at 2026-11-28T10:00:09Z]\n"


class Kubelet:
    """The API server with a kubelet that has `log` for every container: Pods' logs are answered
    from it (in 64 KiB chunks, as a stream comes), everything else by the real API server."""

    def __init__(self, api: Kube, log: bytes) -> None:
        self.api, self.log, self.reads = api, log, 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.api, name)

    async def chunks(self, path: str, params: Any = None, **_: Any) -> AsyncGenerator[bytes]:
        assert path.endswith("/log")
        self.reads += 1
        for at in range(0, len(self.log), 64 * 1024):
            yield self.log[at : at + 64 * 1024]


def route(scan_id: str) -> str:
    return f"/scan/{scan_id}/logs/scanner-server"


async def scanner_pod(api: Kube, namespace: str, scan_id: str, suffix: str = "bcdfg") -> str:
    """A Pod as the scan's Job makes it (on the kwok node), named as the Job controller names them."""
    name = f"{names.job_name(scan_id)}-{suffix}"
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {**names.SCANNER_LABELS, names.SCAN_ID_LABEL: scan_id}},
        "spec": {
            "containers": [{"name": names.container_name(scan_id), "image": "x"}],
            "restartPolicy": "Never",
        },
    }
    await api.request("POST", kube.core_path("pods", namespace), body=pod)
    return name


async def oom_killed(api: Kube, namespace: str, pod: str, scan_id: str) -> dict[str, Any]:
    """The Pod as its watch shows it once the kernel killed its scanner (its status as kubelets write it)."""
    status = {
        "phase": "Failed",
        "containerStatuses": [
            {
                "name": names.container_name(scan_id),
                "ready": False,
                "restartCount": 0,
                "image": "x",
                "imageID": "",
                "state": {"terminated": OOM},
            }
        ],
    }
    got: dict[str, Any] = await api.request(
        "PATCH",
        kube.core_path("pods", namespace, pod, "status"),
        body={"status": status},
        content_type=kube.MERGE_PATCH,
    )
    return got


async def started(shim: ShimUnderTest, scan_id: str, pod: str) -> None:
    """Play the operator: the status names the scanner's Job and Pod; wait for the shim to see it."""
    await shim.operator_writes(
        scan_id, {"job": {"name": names.job_name(scan_id), "pod": pod, "state": "Running"}}
    )

    async def seen() -> bool:
        status = await shim.call("GET", f"/scan/{scan_id}/status")
        return bool(status.body["scanner_server_logs"]["url"] == route(scan_id))

    await eventually(seen, timeout=15)


def settings(**changes: Any) -> OperatorSettings:
    return OperatorSettings(**{"scanner_log_end_bytes": MiB, **changes})


async def kept(api: Kube, namespace: str, scan_id: str) -> dict[str, Any]:
    meta = await payloads.log_metadata(api, namespace, scan_id)
    assert meta is not None
    return meta


async def test_an_oom_killed_scanners_log_is_kept_once_cut_and_served_after_its_pod_and_archiving(
    make_shim: MakeShim,
    api: Kube,
    namespace: str,
    archive_dsn: str,
    capsysbinary: pytest.CaptureFixture[bytes],
) -> None:
    shim = await make_shim(logs_url_template=None, archive_dsn=archive_dsn)
    scan_id = (await shim.launch())["scan_id"]
    status = await shim.call("GET", f"/scan/{scan_id}/status")
    assert status.body["scanner_server_logs"] == {"url": None}  # no scanner yet
    before = await shim.call("GET", route(scan_id))
    assert before.status == 404 and before.body["reason"] == "scanner log not found", before.body

    pod = await scanner_pod(api, namespace, scan_id)
    await started(shim, scan_id, pod)
    assert (await shim.call("GET", f"/scan/{scan_id}/logs")).body == {
        "scanner_server": {"url": route(scan_id)}
    }
    # While it runs the log is read live, from the kubelet: kwok's node has none to give, which the
    # route says in an Error body (the real node's test reads one).
    live = await shim.call("GET", route(scan_id))
    assert live.status == 503 and live.body["reason"] == "scanner log unavailable", live.body
    assert live.headers["Retry-After"] == "5"
    # The container removed since its Pod was read: the kubelet's 200 says so instead of a log, which is
    # never served as one; nothing is kept yet.
    shim.state.api = Kubelet(api, CONTAINER_GONE + b"containerd://0123abcd")
    gone = await shim.call("GET", route(scan_id))
    assert gone.status == 404 and "not kept (yet" in gone.body["message"], gone.body
    shim.state.api = api

    # The kernel kills it; its log is 3.3 MB: 1 MiB of head and 1 MiB of tail are kept.
    log = b"".join(b"%08d scanner line\n" % i for i in range(150_000))
    kubelet = Kubelet(api, log)
    keeper = LogKeeper(kubelet, settings(), None, time.time)  # type: ignore[arg-type]
    keeper.start()
    try:
        pod_event = await oom_killed(api, namespace, pod, scan_id)
        keeper.observe(pod_event, deleted=False)
        keeper.observe(pod_event, deleted=False)  # the same Pod seen again: one read
        meta = await eventually(lambda: payloads.log_metadata(api, namespace, scan_id), timeout=20)
    finally:
        await keeper.stop()
    cut = len(log) - 2 * MiB
    assert meta["annotations"] == {
        payloads.LOG_POD_ANNOTATION: pod,
        payloads.LOG_BYTES_ANNOTATION: str(len(log)),
        payloads.LOG_CUT_ANNOTATION: str(cut),
    }
    assert [o["uid"] for o in meta["ownerReferences"]] == [(await shim.kube_scan(scan_id))["metadata"]["uid"]]
    assert kubelet.reads == 1
    # The operator started again sees the ended Pod again (its list): the log is kept already, unread.
    found = ended(pod_event)
    assert found is not None
    again = LogKeeper(kubelet, settings(), None, time.time)  # type: ignore[arg-type]
    assert await again.keep(found) is False and kubelet.reads == 1
    assert (await kept(api, namespace, scan_id))["resourceVersion"] == meta["resourceVersion"]

    def expected(text: bytes) -> None:
        assert text.startswith(log[:MiB]), text[:100]
        assert text[MiB:].startswith(b"\n" + f"[skyscan: {cut} bytes of this log cut here]\n".encode())
        assert text.endswith(log[-MiB:] + ENDING)
        assert len(text) == 2 * MiB + 1 + len(f"[skyscan: {cut} bytes of this log cut here]\n") + len(ENDING)

    # The Pod goes (the Job's TTL): the kept copy is served, gzip as stored to a client that takes it.
    await api.request("DELETE", kube.core_path("pods", namespace, pod), body={"gracePeriodSeconds": 0})
    with pytest.raises(NotFound):
        await api.request("GET", kube.core_path("pods", namespace, pod))
    served = await shim.call("GET", route(scan_id))
    assert served.status == 200 and served.headers["Content-Encoding"] == "gzip"
    assert served.headers["Content-Type"] == "text/plain; charset=utf-8"
    expected(served.body)
    plain = await shim.call("GET", route(scan_id), as_="viewer", headers={"Accept-Encoding": "identity"})
    assert plain.status == 200 and "Content-Encoding" not in plain.headers and plain.body == served.body
    followed = await shim.call("GET", route(scan_id), params={"follow": "true"})
    assert followed.status == 200 and followed.body == served.body  # it ended: nothing to follow
    # `skyscan logs ID [--follow]` prints it; `--url` says where it is.
    for flags in ([], ["--follow"]):
        code, printed = await asyncio.to_thread(cli, capsysbinary, shim, "logs", scan_id, *flags)
        assert code == exit_codes.OK and printed == served.body
    code, printed = await asyncio.to_thread(cli, capsysbinary, shim, "logs", scan_id, "--url")
    assert code == exit_codes.OK and printed.decode().strip() == route(scan_id)

    # For people only: a scanner's own credential (of any scan) and no credential are refused.
    for who, code in (("system", 403), ("icecube-system", 403), (None, 401)):
        refused = await shim.call("GET", route(scan_id), as_=who)
        assert refused.status == code and refused.body["error"], (who, refused.body)

    # Archived: the scan leaves the cluster with its payloads; its kept log moved with it.
    failed = cond.put([], cond.FAILED, True, "ScannerFailed", "OOMKilled", time.time(), 1)
    await shim.operator_writes(
        scan_id, {"conditions": failed, "job": {"state": "Failed", "reason": "OOMKilled"}}
    )
    archiver = Archiver(api, settings(archive_dsn=archive_dsn, archive_retention_seconds=0), time.time)
    try:
        await eventually(lambda: _moved(archiver, api, namespace, scan_id), timeout=30)
    finally:
        await archiver.close()
    await eventually(lambda: _gone(api, namespace, scan_id), timeout=60)  # garbage-collected with its Scan
    archived = await shim.call("GET", route(scan_id), headers={"Accept-Encoding": "identity"})
    assert archived.status == 200, archived.body
    expected(archived.body)
    assert (await shim.call("GET", f"/scan/{scan_id}/status")).body["scanner_server_logs"]["url"] == route(
        scan_id
    )
    assert (await shim.call("GET", route(scan_id), as_="system")).status == 403


def cli(capsysbinary: pytest.CaptureFixture[bytes], shim: ShimUnderTest, *args: str) -> tuple[int, bytes]:
    """`skyscan ARGS` as a user, its exit code and what it printed."""
    capsysbinary.readouterr()
    code = skyscan.main(["--url", shim.url, "--token", shim.tokens["user"], *args])
    return code, capsysbinary.readouterr().out


async def _moved(archiver: Archiver, api: Kube, namespace: str, scan_id: str) -> bool:
    await archiver.move((namespace, scan_id))
    try:
        await api.request("GET", kube.scan_path(namespace, scan_id))
    except NotFound:
        return True
    return False


async def _gone(api: Kube, namespace: str, scan_id: str) -> bool:
    return await payloads.log_metadata(api, namespace, scan_id) is None


async def test_only_the_scans_own_pod_is_ever_read_and_hostile_reads_get_an_error_body(
    make_shim: MakeShim, api: Kube, namespace: str
) -> None:
    shim = await make_shim(logs_url_template=None)
    mine, other = (await shim.launch())["scan_id"], (await shim.launch())["scan_id"]
    pod = await scanner_pod(api, namespace, mine)
    await started(shim, mine, pod)
    # A status naming another scan's Pod (or any other Pod) is not followed: nothing is read.
    for named in (pod, f"{names.job_name(other)}-bcdf", "kube-apiserver-node", f"{pod}/../x"):
        await shim.operator_writes(other, {"job": {"name": names.job_name(other), "pod": named}})

        async def seen(named: str = named) -> bool:
            return bool(
                (shim.state.scans.live(other) or {}).get("status", {}).get("job", {}).get("pod") == named
            )

        await eventually(seen, timeout=15)
        refused = await shim.call("GET", route(other))
        assert refused.status == 404 and refused.body["reason"] == "scanner log not found", (
            named,
            refused.body,
        )
    # Its own Pod is read (kwok: unavailable, 503); the count of live reads is capped.
    assert (await shim.call("GET", route(mine))).status == 503
    capped = await make_shim(logs_url_template=None, max_log_streams=0)
    full = await capped.call("GET", route(mine))
    assert full.status == 503 and full.body["reason"] == "too many log streams", full.body

    for path, code in (
        (route("0193aaaaaaax0000000000000000dead"), 404),
        (route("x" * 300), 404),
        ("/scan/..%2F..%2Fapi%2Fv1/logs/scanner-server", 404),
        (route(mine) + "?follow=maybe", 400),
    ):
        got = await shim.call("GET", path)
        assert got.status == code and set(got.body) >= {"error", "reason", "message"}, (path, got.body)
