"""`skyscan`: launch, follow, find, fetch and plot scans from a shell, over the REST interface.

Every read takes `--json` (the service's documents, one per line); exit codes are in
`skyscan_client.exit_codes` and docs/cli.md. The service and token come from `--url`/`--token`, else
SKYSCAN_URL/SKYSCAN_TOKEN, else the nearest `.skyscan/env` (written by `make up`).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import yaml
from rich.console import Console

from skyscan_client import exit_codes, follow, plot, tables
from skyscan_client.client import Client, SkyscanError, Unreachable
from skyscan_client.config import ConfigError

# Piped output is for other programs: wide enough that a table row stays one line.
out = Console(highlight=False, width=None if sys.stdout.isatty() else 240)
err = Console(stderr=True, highlight=False)


def emit_json(doc: Any) -> None:
    sys.stdout.write(json.dumps(doc) + "\n")


def reply(doc: Any, as_json: bool, human: Any) -> int:
    """The service's document with --json, else what people read (text or a rich table)."""
    if as_json:
        emit_json(doc)
    else:
        out.print(human, markup=False if isinstance(human, str) else None)  # ids and URLs are not markup
    return exit_codes.OK


def fail(text: str, code: int) -> int:
    err.print(f"skyscan: {text}", markup=False, soft_wrap=True)
    return code


def key_value(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key, value


def scalar(text: str) -> Any:
    """A classifier value as typed on the command line: a JSON number, boolean or null, else the text."""
    try:
        value = json.loads(text)
    except ValueError:
        return text
    return value if isinstance(value, int | float | bool) or value is None else text


def size(text: str) -> int | str:
    return int(text) if text.isdigit() else text


def nside(text: str) -> tuple[str, int]:
    n, _, extension = text.partition(":")
    if not n.isdigit() or not (extension or "0").isdigit():
        raise argparse.ArgumentTypeError(f"expected NSIDE[:PIXEL_EXTENSION], got {text!r}")
    return n, int(extension or 0)


def read_document(path: Path) -> dict[str, Any]:
    text = sys.stdin.read() if str(path) == "-" else path.read_text()
    doc = yaml.safe_load(text) if path.suffix in (".yaml", ".yml") else json.loads(text)
    if not isinstance(doc, dict):
        raise ValueError(f"{path}: expected a JSON/YAML object")
    return doc


# -- commands -------------------------------------------------------------------------------------------


def launch_request(args: argparse.Namespace) -> dict[str, Any]:
    """The POST /scan body: the --file, then each flag given on top of it."""
    request: dict[str, Any] = read_document(args.file) if args.file else {}
    if args.event:
        request["event_live_json"] = read_document(args.event)
    fields: dict[str, Any] = {
        "docker_tag": args.docker_tag,
        "reco_algo": args.reco_algo,
        "sensor_event_id": args.sensor_event_id,
        "nsides": dict(args.nsides) if args.nsides else None,
        "real_or_simulated_event": args.event_kind,
        "predictive_scanning_threshold": args.predictive_scanning_threshold,
        "max_pixel_reco_time": args.max_pixel_reco_time,
        "request_clusters": [[name, int(n)] for name, n in args.cluster] if args.cluster else None,
        "scanner_server_memory_bytes": args.scanner_memory,
        "worker_memory_bytes": args.worker_memory,
        "worker_disk_bytes": args.worker_disk,
        "priority": args.priority,
        "debug_mode": args.debug_mode,
        "classifiers": {k: scalar(v) for k, v in args.classifier} if args.classifier else None,
        "scanner_server_env_from_user": dict(args.env) if args.env else None,
    }
    request.update({k: v for k, v in fields.items() if v is not None})
    request.setdefault("docker_tag", "latest")
    request.setdefault("real_or_simulated_event", "real")
    return request


def cmd_launch(c: Client, args: argparse.Namespace) -> int:
    manifest = c.launch(launch_request(args))
    scan_id = str(manifest["scan_id"])
    if args.json:
        emit_json(manifest)
    else:
        out.print(scan_id, markup=False)
    if args.follow:
        return follow.follow(c.events(scan_id), out, as_json=args.json)
    return exit_codes.OK


def cmd_follow(c: Client, args: argparse.Namespace) -> int:
    events = c.events(args.scan_id, poll_interval=args.poll_interval)
    return follow.follow(events, out, as_json=args.json)


def cmd_status(c: Client, args: argparse.Namespace) -> int:
    doc = c.status(args.scan_id)
    return reply(doc, args.json, tables.status(args.scan_id, doc))


def show_document(doc: Any, as_json: bool) -> int:
    """A whole document: one line with --json, else indented and coloured."""
    if as_json:
        emit_json(doc)
    else:
        out.print_json(data=doc)
    return exit_codes.OK


def cmd_manifest(c: Client, args: argparse.Namespace) -> int:
    doc = c.manifest(args.scan_id, projection=args.projection, include_deleted=args.include_deleted)
    return show_document(doc, args.json)


def cmd_request(c: Client, args: argparse.Namespace) -> int:
    return show_document(c.scan_request(args.scan_id), args.json)


def cmd_logs(c: Client, args: argparse.Namespace) -> int:
    """The scanner server's log itself; `--url`/`--json`: where it is (`GET /scan/{id}/logs`). A replaced
    scan's own (why its scanner died), not its replacement's."""
    if args.url_only or args.json:
        doc = c.logs(args.scan_id, no_redirect=True)
        return reply(doc, args.json, doc["scanner_server"]["url"] or "no log URL (no scanner has run yet)")
    for chunk in c.scanner_log(args.scan_id, follow=args.follow):
        sys.stdout.buffer.write(chunk)
        sys.stdout.buffer.flush()
    return exit_codes.OK


def find_filter(args: argparse.Namespace) -> dict[str, Any]:
    conditions: list[dict[str, Any]] = [json.loads(args.filter)] if args.filter else []
    if args.run is not None:
        conditions.append({"event_metadata.run_id": args.run})
    if args.event is not None:
        conditions.append({"event_metadata.event_id": args.event})
    for key, text in args.classifier or ():
        value = scalar(text)  # a classifier stored as "123" or as 123 both match `k=123`
        conditions.append({f"classifiers.{key}": {"$in": [text, value]} if value != text else text})
    return conditions[0] if len(conditions) == 1 else {"$and": conditions} if conditions else {}


def state_matches(state: str, wanted: str) -> bool:
    """The whole state or a part of it: `IN_PROGRESS`, `partial`, `FINAL`, ..."""
    return wanted.upper() in state


def cmd_find(c: Client, args: argparse.Namespace) -> int:
    projection = None if args.json else tables.FIND_PROJECTION
    found = c.find(find_filter(args), include_deleted=args.include_deleted, projection=projection)
    states: dict[str, str] | None = None
    if args.state:  # the state is computed, not stored: one GET /status per scan found
        states = {str(m["scan_id"]): c.status(str(m["scan_id"]))["scan_state"] for m in found}
        found = [m for m in found if state_matches(states[str(m["scan_id"])], args.state)]
    return reply({"manifests": found}, args.json, tables.scans(found, states))


def cmd_result(c: Client, args: argparse.Namespace) -> int:
    doc = c.result(args.scan_id, include_deleted=args.include_deleted)
    if not doc:
        return fail(f"scan {args.scan_id} has no result yet", exit_codes.NO_RESULT)
    if args.output:
        args.output.write_text(json.dumps(doc.get("scan_result") or {}))
        err.print(f"wrote {args.output}", markup=False)
    if args.json:
        emit_json(doc)
    elif not args.output:
        out.print(tables.result(args.scan_id, doc))
    return exit_codes.OK


def cmd_plot(c: Client, args: argparse.Namespace) -> int:
    try:
        plot.require_extra()
    except plot.PlotExtraMissing as e:
        return fail(str(e), exit_codes.NO_PLOT_EXTRA)
    doc = c.result(args.scan_id, include_deleted=args.include_deleted)
    if not doc.get("scan_result"):
        return fail(f"scan {args.scan_id} has no result yet", exit_codes.NO_RESULT)
    target = args.output or Path(f"{args.scan_id}.skymap.png")
    plot.write_skymap(doc["scan_result"], target, dpi=args.dpi)
    out.print(str(target), markup=False)
    return exit_codes.OK


def cmd_rescan(c: Client, args: argparse.Namespace) -> int:
    manifest = c.rescan(args.scan_id, replace=args.replace, abort_first=args.abort_first)
    return reply(manifest, args.json, str(manifest["scan_id"]))


def cmd_add_workers(c: Client, args: argparse.Namespace) -> int:
    added = c.add_workers(args.scan_id, args.cluster, args.n)
    text = f"{added['n_workers']} workers requested on {args.cluster}: taskforce {added['taskforce_uuid']}"
    return reply(added, args.json, text)


def cmd_abort(c: Client, args: argparse.Namespace) -> int:
    doc = c.abort(args.scan_id, delete_completed_scan=args.delete_completed)
    return reply(doc, args.json, f"aborted {doc['manifest'].get('scan_id', args.scan_id)}")


def cmd_subscribe(c: Client, args: argparse.Namespace) -> int:
    classifiers = {key: scalar(value) for key, value in args.classifier or []}
    made = c.subscribe(
        args.hook_url, args.state, scan_ids=args.scan, classifiers=classifiers, secret=args.secret
    )
    lines = [f"subscription {made['id']}: {', '.join(made['states'])} to {made['url']}"]
    if made.get("secret"):
        lines.append(f"signing secret (shown this once): {made['secret']}")
    return reply(made, args.json, "\n".join(lines))


def cmd_subscriptions(c: Client, args: argparse.Namespace) -> int:
    found = c.subscriptions()
    rows = [
        f"{s['id']}  {s['url']}  {','.join(s['states'])}  pending {s['pending']}  "
        f"delivered {s['delivered']}  failures {s['failures']}  "
        f"last: {(s['last_delivery'] or {}).get('result', 'none yet')}"
        for s in found
    ]
    return reply({"subscriptions": found}, args.json, "\n".join(rows) or "no subscriptions")


def cmd_unsubscribe(c: Client, args: argparse.Namespace) -> int:
    gone = c.unsubscribe(args.subscription_id)
    return reply(gone, args.json, f"deleted subscription {gone['id']}")


# -- the parser -----------------------------------------------------------------------------------------


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="skyscan", description=__doc__.splitlines()[0] if __doc__ else None)
    top.add_argument("--url", help="the service's base URL (else SKYSCAN_URL, else .skyscan/env)")
    top.add_argument("--token", help="a bearer token (else SKYSCAN_TOKEN, else .skyscan/env)")
    sub = top.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, run: Callable[[Client, argparse.Namespace], int], text: str, *, scan: bool = True,
                read: bool = True) -> argparse.ArgumentParser:  # fmt: skip
        p = sub.add_parser(name, help=text, description=text)
        if scan:
            p.add_argument("scan_id", metavar="ID")
        if read:
            p.add_argument("--json", action="store_true", help="print the service's JSON")
        p.set_defaults(handler=run)
        return p

    p = command("launch", cmd_launch, "start a scan; prints its id", scan=False)
    p.add_argument("--file", type=Path, help="a request (JSON, or YAML by .yaml/.yml) the flags add to")
    p.add_argument("--event", type=Path, help="the event: a JSON file (event_live_json)")
    p.add_argument("--sensor-event-id", help="reuse an event stored with an earlier scan")
    p.add_argument("--docker-tag", help="scanner image tag (default: latest)")
    p.add_argument("--reco-algo", help="reconstruction algorithm, e.g. millipede_wilks")
    p.add_argument("--nsides", nargs="+", type=nside, metavar="NSIDE:EXT", help="e.g. 8:0 64:12 512:24")
    kind = p.add_mutually_exclusive_group()
    kind.add_argument("--real", dest="event_kind", action="store_const", const="real", help="a real event")
    kind.add_argument("--simulated", dest="event_kind", action="store_const", const="simulated")
    p.add_argument("--cluster", action="append", type=key_value, metavar="NAME=N", help="workers per cluster")
    p.add_argument("--scanner-memory", type=size, help="scanner server memory (bytes or e.g. 2GB)")
    p.add_argument("--worker-memory", type=size)
    p.add_argument("--worker-disk", type=size)
    p.add_argument("--max-pixel-reco-time", type=int, metavar="SECONDS")
    p.add_argument("--predictive-scanning-threshold", type=float, metavar="X")
    p.add_argument("--priority", type=int)
    p.add_argument("--classifier", action="append", type=key_value, metavar="KEY=VALUE")
    p.add_argument("--debug-mode", action="append", metavar="MODE", help="e.g. client-logs")
    p.add_argument("--env", action="append", type=key_value, metavar="NAME=VALUE", help="scanner server env")
    p.add_argument("--follow", action="store_true", help="then follow it (as `skyscan follow`)")

    p = command("follow", cmd_follow, "show a scan's progress live until it ends")
    p.add_argument("--poll-interval", type=float, default=1.0, help="when the service cannot stream events")
    command("status", cmd_status, "the scan's status")
    p = command("manifest", cmd_manifest, "the scan's manifest")
    p.add_argument("--projection", help="`*` or field names joined by |")
    p.add_argument("--include-deleted", action="store_true")
    command("request", cmd_request, "the request that started the scan")
    p = command("logs", cmd_logs, "the scanner server's log (kept once it ended, else live)")
    p.add_argument("--follow", action="store_true", help="go on printing it as it is written, until it ends")
    p.add_argument("--url", dest="url_only", action="store_true", help="print where it is (its URL)")

    p = command("find", cmd_find, "find scans (a table; --json: the manifests)", scan=False)
    p.add_argument("--run", type=int, help="event_metadata.run_id")
    p.add_argument("--event", type=int, help="event_metadata.event_id")
    p.add_argument("--classifier", action="append", type=key_value, metavar="KEY=VALUE")
    p.add_argument("--state", help="scan_state or a part of it (IN_PROGRESS, SCAN_HAS_FINAL_RESULT, ...)")
    p.add_argument("--include-deleted", action="store_true")
    p.add_argument("--filter", help="a raw MongoDB-style filter (JSON), combined with the options")

    p = command("result", cmd_result, "the scan's result (a summary; -o: skyreader's JSON)")
    p.add_argument(
        "-o", "--output", type=Path, help="write scan_result here (SkyScanResult.read_json reads it)"
    )
    p.add_argument("--include-deleted", action="store_true")
    p = command("plot", cmd_plot, "draw the result's skymap (full sky and zoom) as a PNG", read=False)
    p.add_argument("-o", "--output", type=Path, help="the PNG (default: ID.skymap.png)")
    p.add_argument(
        "--dpi", type=int, default=plot.DPI, help="resolution (skyreader's own PDFs use 300 and 1200)"
    )
    p.add_argument("--include-deleted", action="store_true")

    p = command("rescan", cmd_rescan, "start a new scan from this scan's request; prints its id")
    p.add_argument("--replace", action="store_true", help="the new scan replaces this one")
    p.add_argument("--abort-first", action="store_true", help="abort this scan first")
    p = command("add-workers", cmd_add_workers, "ask the WMS for more workers")
    p.add_argument("--cluster", required=True, metavar="NAME")
    p.add_argument("--n", type=int, required=True, metavar="N")
    p = command("abort", cmd_abort, "abort the scan and mark it deleted")
    p.add_argument("--delete-completed", action="store_true", help="also a scan that has its final result")

    p = command(
        "subscribe", cmd_subscribe, "have scan events POSTed to a webhook (signed CloudEvents)", scan=False
    )
    p.add_argument("--url", dest="hook_url", required=True, help="the receiver (https, on an allowed host)")
    whole_or_half = "a state, whole or either half (SCAN_HAS_FINAL_RESULT, ABORTED...); repeated: any"
    p.add_argument("--state", action="append", required=True, metavar="STATE", help=whole_or_half)
    p.add_argument("--scan", action="append", metavar="ID", help="only this scan (repeat for more)")
    p.add_argument(
        "--classifier", action="append", type=key_value, metavar="KEY=VALUE", help="only scans with it"
    )
    p.add_argument("--secret", help="the signing secret (whsec_ + base64); else one is made and shown once")
    command("subscriptions", cmd_subscriptions, "your subscriptions and their deliveries", scan=False)
    p = command("unsubscribe", cmd_unsubscribe, "delete one of your subscriptions", scan=False)
    p.add_argument("subscription_id", metavar="SUBSCRIPTION")
    return top


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        with Client(args.url, args.token) as c:
            code: int = args.handler(c, args)
            return code
    except SkyscanError as e:
        err.print(f"skyscan: {e.reason} (HTTP {e.status}): {e.message}", markup=False, soft_wrap=True)
        sys.stderr.write(json.dumps({"status": e.status, **e.body}) + "\n")
        if e.status == 404:
            return exit_codes.NOT_FOUND
        return exit_codes.FORBIDDEN if e.status in (401, 403) else exit_codes.REFUSED
    except (ConfigError, Unreachable) as e:
        return fail(str(e), exit_codes.UNREACHABLE)
    except (OSError, ValueError) as e:  # an unreadable --file/--event, a bad --filter
        return fail(str(e), exit_codes.USAGE)
    except KeyboardInterrupt:
        return exit_codes.INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
