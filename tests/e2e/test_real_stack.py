"""`make up NODE=real` as a user runs it: Skyscan installed by its own chart on a real node; a scan
launched with the `skyscan` command through the shim's Service reaches its final result in a scanner
Pod on that node; real failures (the kernel's OOM killer, a Pod deleted or evicted, an image that does
not exist, the active operator's or a shim's Pod deleted) are handled; then `make down` leaves the host
as it found it but the routes holding the node's ranges, which `make reset` releases. One stack for the
module: the tests run in file order, the last one takes it down.

Skipped, loudly (the summary's REAL NODE NOT TESTED section), when the machine cannot run a node."""

from __future__ import annotations

import asyncio
import datetime as dt
import functools
import json
import os
import shlex
import shutil
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest
import yaml

from skyscan import names
from skyscan.io.archive import MIGRATIONS
from skyscan_local import audit, host, node, real_stack
from tests.e2e.test_real_node import NODE_DIR

UNFIT = node.unfit_reason()
pytestmark = [
    pytest.mark.real_node,
    pytest.mark.skipif(UNFIT is not None, reason=f"REAL NODE NOT TESTED: {UNFIT}"),
]
NS = real_stack.NAMESPACE
SCANS = f"/apis/skyscan.io/v1alpha1/namespaces/{NS}/scans"
SCAN_LABEL = names.SCAN_ID_LABEL
EVENT = {"value": {"data": {"run_id": 138632, "event_id": 31747601, "mjd": 59723.32}}}
SKYSCAN = str(Path(sys.executable).parent / "skyscan")


def env_file(d: Path) -> dict[str, str]:
    values = {}
    for line in (d / "env").read_text().splitlines():
        name, _, value = line.removeprefix("export ").partition("=")
        values[name] = shlex.split(value)[0] if value else ""
    return values


def seconds(stamp: str) -> float:
    return dt.datetime.fromisoformat(stamp).timestamp()


def poll(probe: Callable[[], Any], what: str, timeout: float) -> Any:
    """probe()'s first truthy answer, polled until `timeout`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if got := probe():
            return got
        time.sleep(0.25)
    raise AssertionError(f"not within {timeout}s: {what}")


def condition(scan: dict[str, Any], type_: str) -> dict[str, Any]:
    return next((c for c in (scan.get("status") or {}).get("conditions") or [] if c["type"] == type_), {})


def terminated(pod: dict[str, Any]) -> dict[str, Any]:
    statuses = (pod.get("status") or {}).get("containerStatuses") or [{}]
    return dict((statuses[0].get("state") or {}).get("terminated") or {})


@dataclass
class Stack:
    dir: Path
    env: dict[str, str]
    api: real_stack.Api
    before: dict[str, Any]  # the host before `up`

    def rest(self) -> httpx.Client:
        trust = ssl.create_default_context(cafile=self.env["SSL_CERT_FILE"])
        return httpx.Client(
            base_url=self.env["SKYSCAN_URL"],
            # A client retries connecting as the skyscan client does.
            transport=httpx.HTTPTransport(verify=trust, retries=3),
            headers={"Authorization": f"Bearer {self.env['SKYSCAN_USER_TOKEN']}"},
            timeout=10,
        )

    def launch(self, **changes: Any) -> str:
        body = {"docker_tag": "latest", "reco_algo": "millipede_wilks", "nsides": {"8": 0, "64": 12},
                "real_or_simulated_event": "real", "max_pixel_reco_time": 600, "request_clusters": {"osg": 4},
                "priority": 100, "classifiers": {"test": "real-node"}, "event_live_json": EVENT,
                **changes}  # fmt: skip
        with self.rest() as rest:
            got = rest.post("/scan", json=body)
        assert got.status_code == 200, got.text
        return str(got.json()["scan_id"])

    def rest_status(self, scan_id: str) -> dict[str, Any]:
        with self.rest() as rest:
            got = rest.get(f"/scan/{scan_id}/status")
        assert got.status_code == 200, got.text
        return dict(got.json())

    def final(self, scan_id: str) -> bool:
        return bool(self.rest_status(scan_id)["scan_state"] == "SCAN_HAS_FINAL_RESULT")

    def scan(self, scan_id: str) -> dict[str, Any]:
        return self.api.get(f"{SCANS}/{scan_id}") or {}

    def wait_scan(
        self, scan_id: str, check: Callable[[dict[str, Any]], bool], what: str, timeout: float = 90
    ) -> dict[str, Any]:
        try:
            return dict(
                poll(lambda: (s := self.scan(scan_id)) and check(s) and s, f"scan {scan_id}: {what}", timeout)
            )
        except AssertionError as e:
            raise AssertionError(f"{e}\n{self.diagnosis(scan_id)}") from None

    def diagnosis(self, scan_id: str) -> str:
        """What a wait that timed out needs explained: the Scan's status, its Events, its Pods' states,
        and the last lines of them, the operators, the shims and the WMS (the stack is gone once the module
        ends)."""
        out = [f"--- status: {json.dumps(self.scan(scan_id).get('status'), indent=1)}"]
        events = self.api.get(f"/api/v1/namespaces/{NS}/events?fieldSelector=involvedObject.name={scan_id}")
        out += [f"--- event {e['reason']}: {e['message']}" for e in (events or {}).get("items", [])]
        scan_pods = self.pods(f"{SCAN_LABEL}={scan_id}")
        for pod in scan_pods:
            out.append(f"--- pod {pod['metadata']['name']}: {json.dumps(pod.get('status'), indent=1)}")
        serving = self.pods("app.kubernetes.io/component in (operator,shim)")
        for pod in scan_pods + serving + self.pods(f"app.kubernetes.io/name={real_stack.WMS}"):
            name = pod["metadata"]["name"]
            got = self.api.http.get(f"/api/v1/namespaces/{NS}/pods/{name}/log", params={"tailLines": "60"})
            out.append(f"--- {name}:\n{got.text}")
        return "\n".join(out)

    def events(self, scan_id: str, reason: str) -> list[str]:
        got = self.api.get(f"/api/v1/namespaces/{NS}/events?fieldSelector=involvedObject.name={scan_id}")
        return [e["message"] for e in (got or {}).get("items", []) if e["reason"] == reason]

    def pods(self, selector: str) -> list[dict[str, Any]]:
        got = self.api.get(f"/api/v1/namespaces/{NS}/pods?labelSelector={selector}")
        return list((got or {}).get("items", []))

    def scanner_pod(self, scan_id: str, check: Callable[[dict[str, Any]], bool], what: str) -> dict[str, Any]:
        def probe() -> dict[str, Any] | None:
            return next((p for p in self.pods(f"{SCAN_LABEL}={scan_id}") if check(p)), None)

        return dict(poll(probe, f"scanner pod of {scan_id}: {what}", 90))

    def scanner_logs(self, scan_id: str) -> str:
        """The last lines of every container of the scan's scanner Pods, for a failure's message."""
        out = []
        for pod in self.pods(f"{SCAN_LABEL}={scan_id}"):
            name = pod["metadata"]["name"]
            for container in [*pod["spec"].get("initContainers", []), *pod["spec"]["containers"]]:
                got = self.api.http.get(
                    f"/api/v1/namespaces/{NS}/pods/{name}/log",
                    params={"container": container["name"], "tailLines": "15"},
                )
                out.append(f"--- {name}/{container['name']}:\n{got.text}")
        return "\n".join(out)

    def skyscan(self, *args: str) -> subprocess.CompletedProcess[str]:
        """`skyscan ARGS` as a user of this stack (its .skyscan/env)."""
        return subprocess.run(
            [SKYSCAN, *args], env=self.cli_env(), capture_output=True, text=True, timeout=60
        )

    def skyscan_process(self, *args: str) -> subprocess.Popen[str]:
        return subprocess.Popen([SKYSCAN, *args], env=self.cli_env(), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)  # fmt: skip

    def cli_env(self) -> dict[str, str]:
        return {**os.environ, **self.env, "SKYSCAN_LOCAL_DIR": str(self.dir)}

    def delete_scans(self) -> None:
        """Every Scan of the namespace, and wait until they are gone (their workflows aborted)."""
        self.api.http.delete(SCANS).raise_for_status()
        poll(lambda: not (self.api.get(SCANS) or {}).get("items"), "every Scan deleted", 60)


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    node.stop(NODE_DIR)  # what a killed run left (the rest died with it)
    if reason := node.another_node():
        pytest.skip(f"REAL NODE NOT TESTED: {reason}")
    node.ensure_binaries(), node.ensure_images()  # cold builds outside the timings below
    # A stack directory of its own, where PostgreSQL's user may enter (not under /root); the node's
    # directory is test_real_node's, its imported images kept between runs.
    d = Path(tempfile.mkdtemp(prefix="skyscan-test-real-stack-"))
    d.chmod(0o711)  # PostgreSQL's user passes through to real/postgres, and reads nothing else here
    before = host.snapshot()
    try:
        began = time.monotonic()
        env = real_stack.up(d, node_dir=NODE_DIR, tie_to_parent=True)
        print(f"make up NODE=real (warm builds) took {time.monotonic() - began:.1f}s")
        yield Stack(d, env, real_stack.Api(real_stack.real_dir(d) / "cluster"), before)
    finally:
        real_stack.down(d, node_dir=NODE_DIR)
        real_stack.reset(d)
        shutil.rmtree(d)
        if set(node.held_routes()) <= set(before["routes"]):
            node.hold_routes()  # held for another node's data (a `make up NODE=real` not reset) before


@pytest.fixture
def clean(stack: Stack) -> Iterator[Stack]:
    yield stack
    stack.delete_scans()


@pytest.mark.timeout(1500)  # a cold machine builds binaries and images first
def test_a_scan_runs_in_pods_of_the_charts_release_on_a_real_node(stack: Stack, tmp_path: Path) -> None:
    placed = {p["metadata"]["name"].rsplit("-", 2)[0]: p["spec"]["nodeName"] for p in stack.pods("")}
    assert placed == dict.fromkeys(["skyscan-operator", "skyscan-shim", "skyscan-wms"], node.NODE_NAME)

    (tmp_path / "event.json").write_text(json.dumps(EVENT))
    env = {**os.environ, **stack.env, "SKYSCAN_LOCAL_DIR": str(stack.dir)}
    launch = [SKYSCAN, "launch", "--reco-algo", "millipede_wilks", "--nsides", "8:0", "64:12",
              "--max-pixel-reco-time", "600", "--cluster", "osg=4", "--event", "event.json",
              "--follow"]  # fmt: skip
    done = subprocess.run(launch, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SCAN_HAS_FINAL_RESULT" in done.stdout.splitlines()[-1]
    scan_id = done.stdout.splitlines()[0].strip()

    # The final result is sent before the scanner exits.
    pod = stack.scanner_pod(scan_id, lambda p: bool(terminated(p)), "terminated")
    assert pod["spec"]["nodeName"] == node.NODE_NAME
    assert pod["spec"]["containers"][0]["image"] == "localhost/skyscan-scanner:4.2.0"  # the scan's tag
    scanner = pod["status"]["containerStatuses"][0]
    assert scanner["image"].startswith("localhost/skyscan-scanner:")  # containerd names one of its tags
    assert scanner["state"]["terminated"]["exitCode"] == 0
    # It spoke as IceCube's server does, with its own credential: the event read as the manifest's
    # event_i3live_json_dict (it exits 1 without it), workers awaited on /ewms/workforce, results PUT
    # as skyscan_result; what it stored reads back through the interface's names.
    with stack.rest() as rest:
        result = rest.get(f"/scan/{scan_id}/result").json()
    assert result["is_final"] is True and {"nside-8", "nside-64"} <= set(result["scan_result"]), result.keys()
    latency = seconds(scanner["state"]["terminated"]["startedAt"]) - seconds(
        stack.scan(scan_id)["metadata"]["creationTimestamp"]
    )
    print(f"Scan created -> scanner container running: {latency:.0f}s (second resolution)")
    # The archive is PostgreSQL on the host, as a real deployment's outside the cluster: the Pods
    # migrated its schema and hold connections to it from the Pod network.
    assert asyncio.run(archive_clients(stack.env["SKYSCAN_ARCHIVE_DSN"])) == (len(MIGRATIONS), True)


async def archive_clients(dsn: str) -> tuple[int, bool]:
    conn = await asyncpg.connect(dsn)
    try:
        version = await conn.fetchval("SELECT max(version) FROM skyscan_schema")
        from_pods = await conn.fetchval(
            "SELECT count(*) > 0 FROM pg_stat_activity WHERE client_addr <<= $1::cidr", node.POD_CIDR
        )
        return int(version), bool(from_pods)
    finally:
        await conn.close()


@pytest.mark.timeout(240)
def test_a_scanner_over_its_memory_limit_is_oom_killed_by_the_kernel_and_rescanned(clean: Stack) -> None:
    scan_id = clean.launch(scanner_server_memory_bytes=48 * 2**20)  # Python and its imports need more
    pod = clean.scanner_pod(scan_id, lambda p: bool(terminated(p)), "terminated")
    assert (terminated(pod)["reason"], terminated(pod)["exitCode"]) == ("OOMKilled", 137)
    scan = clean.wait_scan(scan_id, lambda s: condition(s, "Deleted").get("reason") == "Replaced", "replaced")
    replacement = clean.scan(scan["spec"]["replacedBy"])
    assert replacement["spec"]["rescanOf"] == scan_id
    (replacing,) = clean.events(scan_id, "Replacing")
    assert "OOMKilled (exit code 137)" in replacing

    # Its log says why, after its Job (and Pod) are gone: the operator kept it with the scan.
    kept = f"/api/v1/namespaces/{NS}/configmaps/{names.log_object_name(scan_id)}"
    poll(lambda: clean.api.get(kept), "the scanner's log kept", 60)
    job = f"/apis/batch/v1/namespaces/{NS}/jobs/{scan['status']['job']['name']}"
    gone = clean.api.http.request("DELETE", job, json={"propagationPolicy": "Background"})
    assert gone.status_code in (200, 202, 404), gone.text  # 404: its TTL (the stack's is short) came first
    poll(lambda: not clean.pods(f"{SCAN_LABEL}={scan_id}"), "the scanner's Job and Pod gone", 60)
    log = clean.skyscan("logs", scan_id)
    assert log.returncode == 0, log.stderr
    assert "[skyscan: the scanner container ended: OOMKilled, exit code 137, at " in log.stdout, log.stdout
    assert clean.skyscan("logs", scan_id, "--url").stdout.strip() == f"/scan/{scan_id}/logs/scanner-server"


@pytest.mark.timeout(330)
@pytest.mark.parametrize("how", ["deleted", "evicted"])
def test_a_scanner_pod_deleted_or_evicted_mid_scan_is_rescanned_and_the_rescan_finishes(
    clean: Stack, how: str
) -> None:
    def replaced(scan: dict[str, Any]) -> bool:
        return condition(scan, "Deleted").get("reason") == "Replaced"

    # The WMS holds the workers back, so the scan is still mid-way when the kubelet signals its scanner
    # (on a busy machine that can be seconds after the test asked).
    wms_config(clean, step_delay=3600)
    try:
        scan_id = clean.launch()
        pod = clean.scanner_pod(scan_id, lambda p: p["status"].get("phase") == "Running", "running")
        path = f"/api/v1/namespaces/{NS}/pods/{pod['metadata']['name']}"
        # A Running Pod's server may still be importing, as PID 1 with no handler yet: SIGTERM would be
        # ignored until the SIGKILL. Its first log line comes after it installed one.
        log = {"container": pod["spec"]["containers"][0]["name"]}
        started = lambda: "scanner server starting" in clean.api.http.get(f"{path}/log", params=log).text  # noqa: E731
        poll(started, "scanner server started", 60)
        # Its log read live through the shim (the kubelet's, through the API server), and followed until
        # the container ends.
        with clean.rest() as rest:
            live = lambda: rest.get(f"/scan/{scan_id}/logs/scanner-server")  # noqa: E731
            poll(lambda: live().status_code == 200, "the log read live through the shim", 30)
            assert "scanner server starting" in live().text
        # Followed from before the container ends: the follower has printed the log's first line.
        following = clean.skyscan_process("logs", scan_id, "--follow")
        printed: list[str] = []
        reader = threading.Thread(target=lambda: printed.extend(following.stdout or ()), daemon=True)
        reader.start()
        poll(lambda: any("scanner server starting" in line for line in printed), "the log followed", 30)
        if how == "deleted":
            clean.api.http.delete(path).raise_for_status()
        else:  # as `kubectl drain` does
            eviction = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": pod["metadata"]}
            clean.api.http.post(f"{path}/eviction", json=eviction).raise_for_status()
        scan = clean.wait_scan(scan_id, replaced, "replaced")
        assert condition(scan, "Complete").get("status") != "True"
    finally:
        wms_config(clean, step_delay=1.0)
    following.wait(timeout=60)  # it ends with the container
    reader.join(10)
    assert following.returncode == 0, following.stderr.read() if following.stderr else ""
    # An evicted Pod is deleted (the Eviction API deletes it): its log is kept only if the operator read
    # it before the kubelet removed the Pod (docs: Logs, Scanner logs).
    kept = clean.api.get(f"/api/v1/namespaces/{NS}/configmaps/{names.log_object_name(scan_id)}")
    print(f"{how}: the scanner's log {'kept' if kept else 'not kept (its Pod went first)'}")
    (replacing,) = clean.events(scan_id, "Replacing")
    assert "(exit code 143)" in replacing  # SIGTERM, as a real server reports it
    new = scan["spec"]["replacedBy"]
    poll(functools.partial(clean.final, new), "the rescan's result", 120)


@pytest.mark.timeout(240)
def test_a_scanner_image_that_does_not_exist_fails_the_scan_with_a_clear_condition(clean: Stack) -> None:
    socket = node.Paths(NODE_DIR).containerd_socket
    missing = "localhost/skyscan-scanner:4.0.0"  # a tag the shim offers, its image removed from the node
    ctr = ["ctr", "--address", str(socket), "--namespace", "k8s.io", "images"]
    subprocess.run([*ctr, "rm", missing], check=True, capture_output=True, timeout=60)
    try:
        scan_id = clean.launch(docker_tag="4.0.0")
        scan = clean.wait_scan(scan_id, lambda s: condition(s, "Failed").get("status") == "True", "failed")
        failed = condition(scan, "Failed")
        assert failed["reason"] == "ImageUnavailable" and missing in failed["message"], failed
        job = scan["status"]["job"]["name"]
        poll(lambda: clean.api.get(f"/apis/batch/v1/namespaces/{NS}/jobs/{job}") is None, "Job deleted", 60)
        assert (clean.scan(scan_id)["status"].get("workflow") or {}).get("deactivated") == "ABORTED"
    finally:
        subprocess.run([*ctr, "tag", "--force", "localhost/skyscan-scanner:dev", missing], check=True,
                       capture_output=True, timeout=60)  # fmt: skip


@pytest.mark.timeout(240)
def test_the_standby_operator_acts_within_15s_of_the_active_ones_pod_being_deleted(clean: Stack) -> None:
    lease_path = f"/apis/coordination.k8s.io/v1/namespaces/{NS}/leases/{real_stack.RELEASE}-operator"
    holder = (clean.api.get(lease_path) or {})["spec"]["holderIdentity"]
    operators = {p["metadata"]["name"] for p in clean.pods("app.kubernetes.io/component=operator")}
    assert holder in operators and len(operators) == 2
    began = time.monotonic()
    clean.api.http.delete(f"/api/v1/namespaces/{NS}/pods/{holder}").raise_for_status()
    scan_id = clean.launch()
    clean.wait_scan(scan_id, lambda s: bool((s.get("status") or {}).get("job")), "a Job", timeout=15)
    acted = time.monotonic() - began
    successor = (clean.api.get(lease_path) or {})["spec"]["holderIdentity"]
    # The standby, or the Deployment's new Pod when it is quicker (both wait on the same Lease).
    assert successor != holder and successor in {
        p["metadata"]["name"] for p in clean.pods("app.kubernetes.io/component=operator")
    }
    print(f"operator Pod deleted -> the standby created a new scan's Job: {acted:.1f}s")
    assert acted < 15
    poll(functools.partial(clean.final, scan_id), "the final result", 120)


def running_ip(stack: Stack, name: str) -> str | None:
    status = (stack.api.get(f"/api/v1/namespaces/{NS}/pods/{name}") or {}).get("status") or {}
    return status.get("podIP") if status.get("phase") == "Running" else None


@pytest.mark.timeout(240)
def test_scanner_pods_reach_only_the_shim_the_wms_and_dns_as_their_network_policy_says(clean: Stack) -> None:
    sleeping = ["python3", "-c", "import time; time.sleep(600)"]
    pods = {"as-scanner": names.SCANNER_LABELS, "other": {"app.kubernetes.io/name": "probe"}}
    for name, labels in pods.items():
        pod = audit.probe_pod(name, NS, labels, sleeping)
        clean.api.http.post(f"/api/v1/namespaces/{NS}/pods", json=pod).raise_for_status()
    ips = {name: poll(functools.partial(running_ip, clean, name), f"{name} running", 60) for name in pods}

    # Enforced once the node's kube-router has chains for the Pod (a moment after it starts).
    poll(lambda: all(f"-s {ip}/32" in audit.node_rules() for ip in ips.values()), "kube-router's rules", 30)
    operator = clean.pods("app.kubernetes.io/component=operator")[0]["status"]["podIP"]
    targets = {"shim": f"{real_stack.SHIM_IP}:8080", "wms": f"{real_stack.WMS}.{NS}.svc:8081",
               "operator": f"{operator}:8081", "API server": "kubernetes.default.svc:443"}  # fmt: skip
    reach = {}
    for name in pods:
        done = subprocess.run(
            ["kubectl", "--kubeconfig", clean.env["KUBECONFIG"], "-n", NS, "exec", name, "--",
             "python3", "-c", audit.CONNECT, *targets.values()],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        reach[name] = {what: f"{target} reached" in done.stdout for what, target in targets.items()}
    assert reach["as-scanner"] == {"shim": True, "wms": True, "operator": False, "API server": False}
    # Other Pods of the namespace: the shim's and the API server, not the operator's ports (its
    # metrics port only, for Prometheus) nor the WMS (the operator and scanners only).
    assert reach["other"] == {"shim": True, "wms": False, "operator": False, "API server": True}
    for name in pods:
        clean.api.http.delete(f"/api/v1/namespaces/{NS}/pods/{name}").raise_for_status()


@pytest.mark.timeout(300)
def test_make_audit_node_finds_every_probe_refused(clean: Stack) -> None:
    """`make audit-node`'s probes (skyscan_local.audit): an attacker's Pod in another namespace, a
    scanner-labelled one, each component's token, the archive's DSN, Pods and Scans the namespace and
    the operator must refuse."""
    probes = audit.Audit(clean.dir).run()
    assert len(probes) >= 25, [p.line() for p in probes]
    assert [p.line() for p in probes if not p.refused] == []


def shim_streams(pod: dict[str, Any]) -> float:
    """The Pod's open event streams, read from its /metrics (the host is on the Pod network)."""
    try:
        got = httpx.get(f"https://{pod['status']['podIP']}:8080/metrics", verify=False, timeout=2)
    except httpx.HTTPError:
        return 0.0
    line = next((x for x in got.text.splitlines() if x.startswith("skyscan_shim_event_streams ")), "x 0")
    return float(line.split()[1])


@pytest.mark.timeout(240)
def test_a_follower_whose_shim_pod_is_deleted_reconnects_through_the_service_to_the_final_state(
    clean: Stack,
) -> None:
    scan_id = clean.launch()
    env = {**os.environ, **clean.env}
    follower = subprocess.Popen([SKYSCAN, "follow", scan_id], env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        serving = poll(
            lambda: next(
                (p for p in clean.pods("app.kubernetes.io/component=shim") if shim_streams(p)), None
            ),
            "the shim Pod serving the follower",
            30,
        )
        clean.api.http.delete(
            f"/api/v1/namespaces/{NS}/pods/{serving['metadata']['name']}"
        ).raise_for_status()
        assert clean.rest_status(scan_id)["scan_state"] != "SCAN_HAS_FINAL_RESULT"  # deleted mid-scan
        try:
            out, err = follower.communicate(timeout=150)
        except subprocess.TimeoutExpired as e:
            printed = e.stdout.decode() if isinstance(e.stdout, bytes) else e.stdout or ""
            raise AssertionError(f"the follower printed:\n{printed}\n{clean.diagnosis(scan_id)}") from None
    finally:
        follower.kill()
    assert follower.returncode == 0, out + err
    assert "SCAN_HAS_FINAL_RESULT" in out.splitlines()[-1]


# The chart's previous version (0.1.0), as this repository had it: the release goes back to it, then
# is upgraded to the working tree's chart while scans run.
PREVIOUS_CHART = "b0b3f547c619ca638959828ea2ad249665b9ba95"


def helm(stack: Stack, *args: str) -> str:
    kubeconfig = str(real_stack.real_dir(stack.dir) / "cluster" / "kubeconfig")
    return real_stack._helm(node.ensure_binaries(), kubeconfig, *args, "--namespace", NS)


def serving_pods(stack: Stack) -> set[str]:
    """The operator's and the shim's Pods once no other is being deleted (a rollout done), else none."""
    pods = [p for p in stack.pods("app.kubernetes.io/component in (operator,shim)")]
    return (
        set()
        if any(p["metadata"].get("deletionTimestamp") for p in pods)
        else {p["metadata"]["name"] for p in pods}
    )


def wms_config(stack: Stack, **changes: Any) -> dict[str, Any]:
    """Change the in-cluster WMS simulator's settings (its Service from the host), with the token its
    OIDC stub grants the operator's client, as every request to it needs."""
    with httpx.Client(base_url=stack.env["SKYSCAN_WMS_URL"], timeout=10) as wms:
        form = {"grant_type": "client_credentials", "client_id": real_stack.WMS_CLIENT_ID,
                "client_secret": real_stack.wms_secret(stack.dir).decode()}  # fmt: skip
        token = wms.post("/oidc/token", data=form)
        token.raise_for_status()
        got = wms.patch(
            "/_sim/config", json=changes, headers={"Authorization": f"Bearer {token.json()['access_token']}"}
        )
        got.raise_for_status()
        return dict(got.json())


@pytest.mark.timeout(600)
def test_helm_upgrade_from_the_previous_chart_version_with_scans_in_flight_loses_none(
    clean: Stack, tmp_path: Path
) -> None:
    repo = real_stack.REPO
    archive = subprocess.run(["git", "-C", str(repo), "archive", PREVIOUS_CHART, "charts/skyscan"],
                             capture_output=True, check=True, timeout=60).stdout  # fmt: skip
    subprocess.run(["tar", "-x", "-C", str(tmp_path)], input=archive, check=True, timeout=60)
    values = real_stack.real_dir(clean.dir) / "values.yaml"
    previous = yaml.safe_load(values.read_text())
    del previous["networkPolicy"]  # new in 0.2.0
    (tmp_path / "previous.yaml").write_text(yaml.safe_dump(previous))
    upgrade = ["upgrade", real_stack.RELEASE, "--wait", "--timeout", "5m"]
    helm(clean, *upgrade[:2], str(tmp_path / "charts" / "skyscan"),
         "--values", str(tmp_path / "previous.yaml"), *upgrade[2:])  # fmt: skip
    grant_job_apply(clean)
    components = poll(lambda: serving_pods(clean), "the previous version's Pods alone", 120)
    # As a release upgrades: a new chart and a new image of the product (here the same build, tagged anew).
    ctr = ["ctr", "--address", str(node.Paths(NODE_DIR).containerd_socket), "--namespace", "k8s.io", "images"]
    subprocess.run([*ctr, "tag", "--force", "localhost/skyscan:dev", "localhost/skyscan:next"], check=True,
                   capture_output=True, timeout=60)  # fmt: skip
    # The WMS holds the workers back until the upgrade is done, so every scan is in flight throughout.
    wms_config(clean, step_delay=3600)
    try:
        scan_ids = [clean.launch() for _ in range(3)]
        clean.scanner_pod(scan_ids[0], lambda p: p["status"].get("phase") == "Running", "running")
        began = time.monotonic()
        helm(
            clean,
            *upgrade[:2],
            str(real_stack.CHART),
            "--values",
            str(values),
            *upgrade[2:],
            "--set",
            "image.tag=next",
        )
        print(f"helm upgrade with {len(scan_ids)} scans in flight: {time.monotonic() - began:.1f}s")
        assert not any(clean.final(i) for i in scan_ids)
    finally:
        wms_config(clean, step_delay=1.0)
    for scan_id in scan_ids:
        ended = clean.wait_scan(scan_id, lambda s: s.get("status", {}).get("state", "").startswith(
            ("SCAN_HAS_FINAL_RESULT", "ABORTED", "FAILED")), "ended", timeout=180)  # fmt: skip
        assert ended["status"]["state"] == "SCAN_HAS_FINAL_RESULT", (
            ended["status"]["conditions"],
            clean.scanner_logs(scan_id),
        )
    assert not serving_pods(clean) & components, "the upgrade replaced every operator and shim Pod"
    history = json.loads(helm(clean, "history", real_stack.RELEASE, "--output", "json"))
    charts = [h["chart"] for h in history[-2:]]
    assert charts[0] == "skyscan-0.1.0" and charts[1] != charts[0], charts
    assert set(scan_ids) <= {
        s["metadata"]["name"] for s in (clean.api.get(SCANS) or {})["items"]
    }  # none lost


def grant_job_apply(stack: Stack) -> None:
    """The product under test server-side applies its Jobs (patch), which chart 0.1.0 did not grant
    its operator, as the 0.1.0 image created them (a real 0.1.0 release runs that image; here it is
    this build): add the verb to the Role the old chart made, as this chart's Role has it."""
    roles = f"/apis/rbac.authorization.k8s.io/v1/namespaces/{NS}/roles"
    for role in (stack.api.get(roles) or {})["items"]:
        for rule in role["rules"]:
            if "jobs" in rule.get("resources", []) and "patch" not in rule["verbs"]:
                rule["verbs"].append("patch")
                stack.api.http.put(f"{roles}/{role['metadata']['name']}", json=role).raise_for_status()
                return
    raise AssertionError("chart 0.1.0 made no operator Role for jobs without patch")


def route_to(address: str) -> str:
    got = subprocess.run(["ip", "route", "get", address], capture_output=True, text=True)
    return (got.stdout + got.stderr).splitlines()[0]


@pytest.mark.timeout(300)
def test_make_down_leaves_the_host_as_it_found_it_but_the_routes_held_until_make_reset(stack: Stack) -> None:
    pod = "10.99.0.200"
    assert f"dev {node.BRIDGE} src {node.GATEWAY}" in route_to(real_stack.SHIM_IP)  # the node runs
    real_stack.down(stack.dir, node_dir=NODE_DIR)
    after = host.snapshot()
    for part in ("mounts", "interfaces", "iptables", "ipsets", "sysctls"):
        assert after[part] == stack.before[part], part
    # Its Service and Pod ranges held unreachable: a client of the stale `.skyscan/env` is refused at
    # once, on this machine, not sent out by the default route.
    held = node.held_routes()
    assert after["routes"] == sorted({*stack.before["routes"], *held})
    assert "No route to host" in route_to(real_stack.SHIM_IP) and "No route to host" in route_to(pod)
    with pytest.raises(httpx.ConnectError):  # not a ConnectTimeout
        httpx.get(f"{stack.env['SKYSCAN_URL']}/healthz", timeout=5)
    real_stack.reset(stack.dir)
    assert host.routes() == sorted(set(stack.before["routes"]) - set(held))
