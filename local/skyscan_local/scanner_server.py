"""The scanner image's server: what `python -m skymap_scanner.server ARGS` runs in a scanner Job's
container on a real node (local/scanner_image).

The scanner simulator plays held Pods from outside them, reading their env and args through the API;
here the same `ScannerServer` runs inside the Pod, as the real skymap-scanner server does: the
operator's args on its command line, the REST address, scan id and token in its env (the token from
the per-scan Secret, put there by the kubelet), startup.json written to `--client-startup-json` for
the Pod's own native sidecar to upload. It exits as the real server would: 0 after the final result,
130 when the kill switch fires, 143 on SIGTERM (its Pod deleted or evicted), 1 when the REST API
keeps failing. Settings: `SKYSCAN_SCANNER_SIM_*`.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import httpx

from skyscan.scanner_args import COMMON_SPACE
from skyscan_local import scanner_report
from skyscan_local.scanner_pod import ScannerExit, ScannerSimSettings, ServerPod
from skyscan_local.scanner_simulator import Rest, ScannerServer

log = logging.getLogger("skymap_scanner.server")
REQUIRED_ENV = ("SKYSCAN_SKYDRIVER_ADDRESS", "SKYSCAN_SKYDRIVER_SCAN_ID")


def server_pod(env: Mapping[str, str], args: Sequence[str]) -> ServerPod:
    """What the server knows at its start, from its own env and command line (the Pod's)."""
    missing = [name for name in REQUIRED_ENV if not env.get(name)]
    if missing:
        raise ScannerExit(2, f"missing environment: {', '.join(missing)}")
    argv = list(args)
    startup = argv[argv.index("--client-startup-json") + 1] if "--client-startup-json" in argv[:-1] else ""
    return ServerPod(
        pod_name=env.get("HOSTNAME", "scanner"),
        uid="",
        address=env["SKYSCAN_SKYDRIVER_ADDRESS"].rstrip("/"),
        scan_id=env["SKYSCAN_SKYDRIVER_SCAN_ID"],
        token=env.get("SKYSCAN_SKYDRIVER_AUTH", ""),
        args=scanner_report.parse_server_args(argv),
        startup_json=Path(startup or f"{COMMON_SPACE}/startup.json"),
        sidecar=None,  # the kubelet runs the Pod's sidecar
    )


async def serve(pod: ServerPod, settings: ScannerSimSettings) -> None:
    headers = {"Content-Type": "application/json"}
    if pod.token:
        headers["Authorization"] = f"Bearer {pod.token}"
    # httpx trusts SSL_CERT_FILE, which the operator points at the shim's CA when it mounts one.
    async with httpx.AsyncClient(
        base_url=pod.address, headers=headers, timeout=settings.request_timeout_seconds
    ) as http:
        await ScannerServer(pod, Rest(http, settings), settings).run()


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    args = list(sys.argv[1:] if argv is None else argv)
    began, terminated = time.monotonic(), False

    def on_sigterm(signum: int, frame: object) -> None:
        nonlocal terminated
        terminated = True
        raise KeyboardInterrupt

    # The Pod deleted or evicted: as PID 1 the server would ignore SIGTERM until SIGKILL; it ends at
    # once with the status of a process killed by SIGTERM (143), as the real one reports.
    signal.signal(signal.SIGTERM, on_sigterm)
    try:
        pod = server_pod(os.environ, args)
        log.info("scan %s: scanner server starting with %s", pod.scan_id, args)
        asyncio.run(serve(pod, ScannerSimSettings()))
        log.info("scan %s: done in %.1fs", pod.scan_id, time.monotonic() - began)
        return 0
    except KeyboardInterrupt:
        return 128 + signal.SIGTERM if terminated else 130
    except ScannerExit as e:
        log.warning("scanner server exits %d: %s", e.code, e)
        return e.code


if __name__ == "__main__":
    sys.exit(main())
