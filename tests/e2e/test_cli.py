"""The `skyscan` command against the whole local stack, run as a user runs it: a subprocess with
SKYSCAN_URL/SKYSCAN_TOKEN. Launch → follow → result → plot on the scanner simulator's real results,
find, the actions, and the error paths' exit codes and Error bodies."""

from __future__ import annotations

import io
import json
import os
import re
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import yaml

from skyscan_client import exit_codes
from skyscan_client.client import Client
from tests.e2e.conftest import LONG_NSIDES, Stack, scan_request, workers_held

pytestmark = pytest.mark.timeout(240)  # one xdist worker runs the module (tests/conftest.py TOGETHER)
MAIN = "import sys; from skyscan_client.cli import main; sys.exit(main())"


@dataclass(frozen=True)
class Run:
    code: int
    out: str
    err: str


def skyscan(
    stack: Stack, cwd: Path, *args: str, token: str | None = None, timeout: float = 120, before: str = ""
) -> Run:
    """The command's entry point in a fresh interpreter (`before`: Python run first)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SKYSCAN_")}
    env |= {"SKYSCAN_URL": stack.url, "SKYSCAN_TOKEN": token or stack.user_token}
    argv = [sys.executable, "-c", before + MAIN, *args]
    done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    return Run(done.returncode, done.stdout, done.stderr)


def error_body(run: Run) -> dict[str, object]:
    body: dict[str, object] = json.loads(run.err.strip().splitlines()[-1])
    return body


@dataclass(frozen=True)
class Launched:
    scan_id: str
    run_id: int
    event_id: int
    follow: Run
    workdir: Path


@pytest.fixture(scope="module")
def launched(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> Launched:
    """One scan launched from a YAML request and an event file, followed to its end by the command."""
    workdir = tmp_path_factory.mktemp("cli")
    run_id, event_id = 100_000 + secrets.randbelow(900_000), secrets.randbelow(10**8)
    (workdir / "event.json").write_text(
        json.dumps({"value": {"data": {"run_id": run_id, "event_id": event_id, "mjd": 60000.5}}})
    )
    request = {"docker_tag": "latest", "reco_algo": "millipede_wilks", "max_pixel_reco_time": 600}
    (workdir / "request.yaml").write_text(yaml.safe_dump(request))
    run = skyscan(
        stack, workdir, "launch", "--file", "request.yaml", "--event", "event.json",
        "--nsides", "8:0", "64:12", "--cluster", "osg=2", "--priority", "100",
        "--classifier", "origin=cli-test", "--follow",
    )  # fmt: skip
    assert run.code == exit_codes.OK, run.err
    return Launched(run.out.splitlines()[0].strip(), run_id, event_id, run, workdir)


def test_launch_follows_to_the_final_result(launched: Launched) -> None:
    lines = launched.follow.out.splitlines()
    assert len(launched.scan_id) == 32 and lines[0] == launched.scan_id
    states = [line.partition("]")[2].split()[0] for line in lines[1:]]
    assert states[-1] == "SCAN_HAS_FINAL_RESULT"
    assert "PENDING__PRESTARTUP" in states[:2]  # followed from the start, one line per change
    assert any(state.startswith("IN_PROGRESS__") for state in states)
    assert "768/" in launched.follow.out  # pixels done/total of the whole sky at nside 8


def test_follow_reads_one_event_stream(stack: Stack, launched: Launched) -> None:
    """The whole scan came through one GET /scan/{id}/events (the shim's access log; the scanner
    simulator's kill switch polls /status, so that route says nothing about the command). The shim
    writes its lines in batches a fraction of a second apart: the stream's may follow the command's end."""

    def streams() -> list[str]:
        log = (stack.settings.dir / "logs" / "shim.log").read_text().splitlines()
        return [line for line in log if "GET /scan/{scan_id}/events" in line and launched.scan_id in line]

    deadline = time.monotonic() + 10
    while not (found := streams()) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert len(found) == 1 and " 200 " in found[0], found


def test_result_is_written_in_skyreader_format(stack: Stack, launched: Launched) -> None:
    run = skyscan(stack, launched.workdir, "result", launched.scan_id, "-o", "result.json")
    assert run.code == exit_codes.OK, run.err
    stored = json.loads((launched.workdir / "result.json").read_text())
    assert len(stored["nside-8"]["data"]) == 768 and stored["nside-64"]["data"]
    assert stored["nside-8"]["metadata"]["run_id"] == launched.run_id

    summary = skyscan(stack, launched.workdir, "result", launched.scan_id)
    assert "final result" in summary.out and "768" in summary.out


def test_plot_draws_a_skymap_from_the_stored_result(stack: Stack, launched: Launched) -> None:
    from matplotlib import image

    run = skyscan(stack, launched.workdir, "plot", launched.scan_id, "-o", "skymap.png", timeout=200)
    assert run.code == exit_codes.OK, run.err
    assert run.out.strip() == "skymap.png"
    png = (launched.workdir / "skymap.png").read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 50_000
    pixels = image.imread(io.BytesIO(png), format="png")
    height, width = pixels.shape[:2]
    assert width > 2 * height > 500  # the full sky and the zoom, side by side
    colours = {tuple(p) for p in (pixels[:, :, :3] * 255).astype(int).reshape(-1, 3)[::7]}
    assert len(colours) > 500  # a landscape with a best-fit region, not a flat map


def test_find_by_run_and_event(stack: Stack, launched: Launched) -> None:
    args = ("find", "--run", str(launched.run_id), "--event", str(launched.event_id))
    run = skyscan(stack, launched.workdir, *args, "--json")
    assert run.code == exit_codes.OK, run.err
    assert [m["scan_id"] for m in json.loads(run.out)["manifests"]] == [launched.scan_id]

    table = skyscan(stack, launched.workdir, *args, "--classifier", "origin=cli-test", "--state", "final")
    assert launched.scan_id in table.out and "SCAN_HAS_FINAL_RESULT" in table.out
    none = skyscan(stack, launched.workdir, *args, "--state", "IN_PROGRESS", "--json")
    assert json.loads(none.out) == {"manifests": []}


def test_reads_print_the_documents_with_json(stack: Stack, launched: Launched) -> None:
    for command in ("status", "manifest", "request", "logs"):
        run = skyscan(stack, launched.workdir, command, launched.scan_id, "--json")
        assert run.code == exit_codes.OK, (command, run.err)
        doc = json.loads(run.out)
        assert doc, command
    status = json.loads(skyscan(stack, launched.workdir, "status", launched.scan_id, "--json").out)
    assert status["scan_complete"] is True


@pytest.fixture
def client(stack: Stack) -> Iterator[Client]:
    with Client(stack.url, stack.user_token) as c:
        yield c


def wait_in_progress(client: Client, scan_id: str) -> None:
    for event in client.events(scan_id, poll_interval=0.2):
        if event.state.startswith("IN_PROGRESS__") or event.terminal:
            return


def test_actions_and_a_followed_abort(stack: Stack, client: Client, tmp_path: Path) -> None:
    (tmp_path / "event.json").write_text(json.dumps({"run_id": 123457, "event_id": 7}))
    nsides = [f"{n}:0" for n in LONG_NSIDES]
    with workers_held(stack):  # so both scans are mid-way when aborted, however busy the machine
        run = skyscan(
            stack, tmp_path, "launch", "--reco-algo", "millipede_wilks", "--max-pixel-reco-time", "600",
            "--event", "event.json", "--nsides", *nsides, "--cluster", "osg=1", "--priority", "100", "--json",
        )  # fmt: skip
        assert run.code == exit_codes.OK, run.err
        scan_id = json.loads(run.out)["scan_id"]
        wait_in_progress(client, scan_id)

        added = skyscan(stack, tmp_path, "add-workers", scan_id, "--cluster", "osg", "--n", "2", "--json")
        assert added.code == exit_codes.OK, added.err
        assert json.loads(added.out)["n_workers"] == 2

        rescan = skyscan(stack, tmp_path, "rescan", scan_id)
        assert rescan.code == exit_codes.OK, rescan.err
        new = rescan.out.strip()
        assert new != scan_id and client.manifest(new)["classifiers"]["origin_scan_id"] == scan_id

        for target in (scan_id, new):
            aborted = skyscan(stack, tmp_path, "abort", target)
            assert aborted.code == exit_codes.OK, aborted.err
            followed = skyscan(stack, tmp_path, "follow", target, "--json", "--poll-interval", "0.2")
            assert followed.code == exit_codes.ABORTED, followed.out + followed.err
            assert json.loads(followed.out.splitlines()[-1])["status"]["is_deleted"] is True


def test_status_says_where_a_waiting_scan_waits_and_why(stack: Stack, client: Client, tmp_path: Path) -> None:
    """The WMS refuses new workflows for a while (503): a scan's start is interrupted, and it waits in
    the backlog until the WMS is back; `skyscan status` says where and why."""
    refuse = {"status": 503, "seconds": 120, "method": "POST", "path_prefix": "/v1/workflows"}
    wide = "import os; os.environ['COLUMNS'] = '200'; "  # the row unwrapped
    with httpx.Client(base_url=stack.wms_url, timeout=10) as wms:
        wms.post("/_sim/faults", json=refuse).raise_for_status()
        try:
            scan_id = str(client.launch(scan_request())["scan_id"])
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                run = skyscan(stack, tmp_path, "status", scan_id, before=wide)
                row = next((line for line in run.out.splitlines() if line.startswith("backlog")), "")
                if "Outage" in row:
                    break
            assert re.fullmatch(
                r"backlog +position \d+ · Outage \(its start was interrupted by an outage; retrying\) · "
                r"about \d+ (s|min)",
                row.strip(),
            ), run.out
        finally:
            wms.post("/_sim/clear").raise_for_status()
    assert client.status(scan_id)["backlog"]["wait_reason"] == "Outage"
    for event in client.events(scan_id, poll_interval=0.2):  # the WMS is back: it starts
        if event.state != "PENDING__PRESTARTUP" or event.terminal:
            break
    assert client.status(scan_id)["backlog"] is None
    client.abort(scan_id)


def test_error_paths_exit_with_their_codes_and_the_error_body(stack: Stack, tmp_path: Path) -> None:
    unknown = skyscan(stack, tmp_path, "status", "no-such-scan")
    assert unknown.code == exit_codes.NOT_FOUND
    assert error_body(unknown) == {
        "status": 404,
        "error": "Not Found",
        "reason": "scan not found",
        "message": "No scan with this id (or it is deleted; see include_deleted).",
    }
    assert skyscan(stack, tmp_path, "result", "no-such-scan", "--json").code == exit_codes.NOT_FOUND

    forbidden = skyscan(stack, tmp_path, "find", "--run", "1", token="not-a-token")
    assert forbidden.code == exit_codes.FORBIDDEN and error_body(forbidden)["status"] == 401

    refused = skyscan(stack, tmp_path, "launch", "--reco-algo", "millipede_wilks")
    assert refused.code == exit_codes.REFUSED and error_body(refused)["status"] == 400

    gone = Stack(**{**stack.__dict__, "url": "http://127.0.0.1:9"})
    assert skyscan(gone, tmp_path, "status", "x").code == exit_codes.UNREACHABLE


def test_plot_without_the_extra_says_how_to_install_it(stack: Stack, launched: Launched) -> None:
    hidden = "import sys; sys.modules['skyreader'] = None; "  # as if the plot extra were not installed
    run = skyscan(stack, launched.workdir, "plot", launched.scan_id, before=hidden)
    assert run.code == exit_codes.NO_PLOT_EXTRA
    assert "pip install 'skyscan[plot]'" in run.err
