"""`make demo`: one scan through the REST API, from submission to its final result.

Reads SKYSCAN_URL and SKYSCAN_USER_TOKEN from the environment, else from `.skyscan/env` (written by
`make up`). Submits a scan, shows its progress live (state, pixels, workers), and prints a summary
of the result. The local stack must run the scanner simulator (`make demo` starts it).
"""

from __future__ import annotations

import os
import shlex
import sys
import time
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[2]
FINAL = "SCAN_HAS_FINAL_RESULT"

# A small realtime-style event; the scanner derives the event metadata from it.
DEMO_EVENT = {
    "value": {
        "data": {
            "run_id": 138632,
            "event_id": 31747601,
            "mjd": 59723.32,
            "event_type": "neutrino",
            "frames": "(a real event carries its detector frames here)",
        }
    },
    "source": "skyscan demo",
}
DEMO_REQUEST = {
    "docker_tag": "latest",
    "reco_algo": "millipede_wilks",
    "nsides": {"8": 0, "64": 12, "512": 24},
    "real_or_simulated_event": "real",
    "predictive_scanning_threshold": 1.0,
    "max_pixel_reco_time": 600,
    "request_clusters": {"osg": 4},
    "worker_memory": "4GB",
    "classifiers": {"source": "make demo"},
    "priority": 100,
    "event_live_json": DEMO_EVENT,
}


def read_env_file(path: Path) -> dict[str, str]:
    values: dict[str, str] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            words = shlex.split(line)
            if len(words) == 2 and words[0] == "export" and "=" in words[1]:
                key, _, value = words[1].partition("=")
                values[key] = value
    return values


def pixels(progress: dict[str, Any] | None) -> str:
    overall = ((progress or {}).get("tallies") or {}).get("overall") or {}
    p = overall.get("pixels") or {}
    return f"{p.get('done', 0)}/{int(p.get('generated') or 0)} pixels" if p else "no pixels yet"


def summary(scan_id: str, result: dict[str, Any], status: dict[str, Any], seconds: float) -> str:
    lines = [f"\nScan {scan_id}: {status['scan_state']} after {seconds:.1f}s"]
    for key, block in sorted((result.get("scan_result") or {}).items(), key=lambda kv: int(kv[0][6:])):
        rows = block.get("data") or []
        llh = block["columns"].index("llh")
        best = min(rows, key=lambda r: r[llh]) if rows else None
        best_text = f"best pixel {best[0]} (llh {best[llh]})" if best else "no pixels"
        lines.append(f"  {key:>9}: {len(rows):3} pixels, {best_text}")
    blocks: dict[str, Any] = result.get("scan_result") or {}
    first: dict[str, Any] = next(iter(blocks.values()), {})
    meta: dict[str, Any] = first.get("metadata") or {}
    lines.append(f"  event: run {meta.get('run_id')} event {meta.get('event_id')} ({meta.get('event_type')})")
    lines.append(f"  final result: {result.get('is_final')}   WMS workflow: {status.get('wms_deactivated')}")
    return "\n".join(lines)


def run(url: str, token: str, timeout: float = 300.0) -> int:
    http = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=30)
    began = time.monotonic()
    created = http.post("/scan", json=DEMO_REQUEST)
    if created.status_code != 200:
        print(f"POST /scan failed: HTTP {created.status_code} {created.text}", file=sys.stderr)
        return 1
    scan_id = created.json()["scan_id"]
    print(f"submitted scan {scan_id} (docker tag {DEMO_REQUEST['docker_tag']}, nsides 8:0 64:12 512:24)")
    print(f"  kubectl -n {os.environ.get('SKYSCAN_NAMESPACE', 'skyscan')} get scan {scan_id}")
    live = sys.stdout.isatty()
    last = ""
    while True:
        status = http.get(f"/scan/{scan_id}/status").json()
        manifest = http.get(f"/scan/{scan_id}/manifest").json()
        progress = manifest.get("progress") or {}
        workers = (status.get("wms_workforce") or {}).get("n_running", 0)
        line = (
            f"[{time.monotonic() - began:5.1f}s] {status['scan_state']:45} {pixels(progress):14} "
            f"workers {workers}  {progress.get('summary', '')}"
        )
        if line.split("]", 1)[1] != last.split("]", 1)[-1]:
            print(("\r\033[K" if live else "") + line, end="" if live else "\n", flush=True)
        last = line
        if status["scan_state"] == FINAL:
            break
        ended = status.get("is_deleted") or status.get("wms_deactivated")
        if ended or time.monotonic() - began > timeout:
            print(f"\nthe scan did not finish ({status['scan_state']}); see .skyscan/logs/", file=sys.stderr)
            return 1
        time.sleep(0.5)
    seconds = time.monotonic() - began
    # The operator tells the WMS `finished` after its teardown delay; show that too when it is short.
    deadline = time.monotonic() + 15
    while not status.get("wms_deactivated") and time.monotonic() < deadline:
        time.sleep(0.5)
        status = http.get(f"/scan/{scan_id}/status").json()
    result = http.get(f"/scan/{scan_id}/result").json()
    print(summary(scan_id, result, status, seconds))
    return 0


def main() -> int:
    env = {**read_env_file(REPO / ".skyscan" / "env"), **os.environ}
    if "SKYSCAN_URL" not in env or "SKYSCAN_USER_TOKEN" not in env:
        print("no SKYSCAN_URL/SKYSCAN_USER_TOKEN: run `make up SIMULATE_SCANNER=1` first", file=sys.stderr)
        return 2
    os.environ.setdefault("SKYSCAN_NAMESPACE", env.get("SKYSCAN_NAMESPACE", "skyscan"))
    try:
        return run(env["SKYSCAN_URL"], env["SKYSCAN_USER_TOKEN"])
    except httpx.HTTPError as e:
        print(f"cannot reach the REST API at {env['SKYSCAN_URL']}: {e!r}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
