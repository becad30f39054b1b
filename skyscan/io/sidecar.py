"""The scanner Pod's startup.json sidecar: `skyscan-sidecar [PATH]` (`python -m skyscan.io.sidecar`).

The scanner server writes `startup.json` (100-530 KB of JSON) into the volume it shares with this
sidecar. The sidecar waits until the file is there and complete (its size and mtime unchanged for
`--settle-seconds`, and it parses as JSON), uploads it with the scan's own credential to
`PUT {SKYSCAN_SKYDRIVER_ADDRESS}/scan/{SKYSCAN_SKYDRIVER_SCAN_ID}/startup.json`
(`Authorization: Bearer {SKYSCAN_SKYDRIVER_AUTH}`), retrying connection errors, 408, 429 and 5xx with
backoff for up to `--retry-seconds`, and then stays alive until it is terminated, as a Kubernetes
native sidecar does (`--exit-when-done` exits 0 instead). Workers fetch the file from the REST shim
through a presigned URL.

Exit codes: 0 uploaded (or terminated by SIGTERM/SIGINT), 1 the upload failed (a refusal, or retries
exhausted; as a native sidecar it is then restarted by the kubelet), 2 a usage error.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import time
from pathlib import Path
from types import FrameType

import httpx
import tenacity

DEFAULT_PATH = "/common-space/startup.json"
RETRY_STATUSES = frozenset({408, 429, 500, 502, 503, 504})
ENV = ("SKYSCAN_SKYDRIVER_ADDRESS", "SKYSCAN_SKYDRIVER_SCAN_ID", "SKYSCAN_SKYDRIVER_AUTH")
log = logging.getLogger("skyscan.io.sidecar")


class UploadFailed(Exception):
    pass


def complete_contents(path: Path, poll_seconds: float, settle_seconds: float, timeout: float | None) -> bytes:
    """The file's bytes once it exists, is non-empty, has not changed for `settle_seconds` and is
    valid JSON (a half-written file is neither stable nor parseable)."""
    deadline = None if timeout is None else time.monotonic() + timeout
    seen: tuple[int, int] | None = None
    since = 0.0
    while True:
        try:
            stat = path.stat()
            current: tuple[int, int] | None = (stat.st_size, stat.st_mtime_ns) if stat.st_size else None
        except FileNotFoundError:
            current = None
        now = time.monotonic()
        if current != seen:
            seen, since = current, now
        elif current is not None and now - since >= settle_seconds:
            data = path.read_bytes()
            try:
                json.loads(data)
            except ValueError:
                pass  # still being written (or rewritten): keep watching
            else:
                if len(data) == current[0]:
                    return data
        if deadline is not None and now > deadline:
            raise TimeoutError(f"{path} did not appear complete within {timeout:g}s")
        time.sleep(poll_seconds)


def upload(
    url: str,
    token: str,
    data: bytes,
    *,
    retry_seconds: float,
    request_timeout: float,
    first_delay: float = 0.5,
) -> httpx.Response:
    """PUT the file; retry what may heal (connection errors, 408/429/5xx) with exponential backoff
    (`first_delay`, doubling, at most 30 s), as long as the next try starts within `retry_seconds`."""
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"

    def exhausted(state: tenacity.RetryCallState) -> None:
        raise UploadFailed(f"still failing after {retry_seconds:g}s: {_why(state)}")

    def again(state: tenacity.RetryCallState) -> None:
        log.warning("upload failed (%s); retrying in %.1fs", _why(state), state.upcoming_sleep)

    retrying = tenacity.Retrying(
        stop=tenacity.stop_before_delay(retry_seconds),
        wait=tenacity.wait_exponential(multiplier=first_delay, max=30.0),
        retry=tenacity.retry_if_exception_type(httpx.TransportError)
        | tenacity.retry_if_result(lambda r: r.status_code in RETRY_STATUSES),
        retry_error_callback=exhausted,
        before_sleep=again,
    )
    with httpx.Client(timeout=request_timeout) as http:
        response: httpx.Response = retrying(http.put, url, content=data, headers=headers)
    if response.is_error:
        raise UploadFailed(f"HTTP {response.status_code}: {response.text[:300]}")
    return response


def _why(state: tenacity.RetryCallState) -> str:
    """What went wrong with the last try."""
    assert state.outcome is not None
    if state.outcome.failed:
        return repr(state.outcome.exception())
    return f"HTTP {state.outcome.result().status_code}"


def _terminated(signum: int, frame: FrameType | None) -> None:
    log.info("terminated (signal %d)", signum)
    sys.exit(0)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="skyscan-sidecar",
        description="Upload the scanner's startup.json to the REST shim, then stay alive (native sidecar).",
        epilog=f"Environment: {', '.join(ENV)}.",
    )
    p.add_argument(
        "path", nargs="?", default=DEFAULT_PATH, help=f"the file to upload (default {DEFAULT_PATH})"
    )
    p.add_argument("--exit-when-done", action="store_true", help="exit 0 after the upload instead of staying")
    p.add_argument("--poll-seconds", type=float, default=0.5, help="how often the file is checked")
    p.add_argument("--settle-seconds", type=float, default=1.0, help="unchanged this long counts as complete")
    p.add_argument("--wait-timeout", type=float, default=None, help="give up waiting (default: never)")
    p.add_argument("--retry-seconds", type=float, default=3600.0, help="how long an upload is retried")
    p.add_argument("--request-timeout", type=float, default=60.0, help="timeout of one PUT")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    missing = [name for name in ENV[:2] if not os.environ.get(name)]
    if missing:
        print(f"skyscan-sidecar: set {', '.join(missing)}", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, _terminated)
    signal.signal(signal.SIGINT, _terminated)
    address, scan_id = (
        os.environ["SKYSCAN_SKYDRIVER_ADDRESS"].rstrip("/"),
        os.environ["SKYSCAN_SKYDRIVER_SCAN_ID"],
    )
    url = f"{address}/scan/{scan_id}/startup.json"
    path = Path(args.path)
    log.info("scan %s: waiting for %s", scan_id, path)
    try:
        data = complete_contents(path, args.poll_seconds, args.settle_seconds, args.wait_timeout)
        log.info("scan %s: %s is complete (%d bytes); uploading to %s", scan_id, path, len(data), url)
        upload(
            url,
            os.environ.get("SKYSCAN_SKYDRIVER_AUTH", ""),
            data,
            retry_seconds=args.retry_seconds,
            request_timeout=args.request_timeout,
        )
    except (UploadFailed, TimeoutError) as e:
        log.error("scan %s: startup.json not uploaded: %s", scan_id, e)
        return 1
    log.info("scan %s: startup.json uploaded (%d bytes)", scan_id, len(data))
    if args.exit_when_done:
        return 0
    while True:  # a native sidecar lives as long as its Pod; SIGTERM ends it
        time.sleep(3600)


if __name__ == "__main__":
    sys.exit(main())
