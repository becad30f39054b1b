"""`make demo`: one scan through the REST API, from submission to its final result and its skymap.

Talks to the stack `make up` started (its `.skyscan/env`, or SKYSCAN_URL/SKYSCAN_TOKEN) through the
`skyscan` command's own parts: the client launches the scan and follows it (live on a terminal, a
line per change otherwise), then the result is summarised and drawn with icecube-skyreader into
`.skyscan/skymap-<scan id>.png`, whose path is the last line printed. The local stack must run the
scanner simulator (`make demo` starts it).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

from rich.console import Console

from skyscan_client import exit_codes, follow, plot, tables
from skyscan_client.client import Client, SkyscanError, Unreachable
from skyscan_client.config import ConfigError

REPO = Path(__file__).resolve().parents[2]

# A small realtime-style event; the scanner derives the event metadata (and the simulator its sky) from it.
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


def local_dir() -> Path:
    return Path(os.environ.get("SKYSCAN_LOCAL_DIR") or REPO / ".skyscan")


def run(client: Client, console: Console, folder: Path) -> int:
    began = time.monotonic()
    scan_id = str(client.launch(DEMO_REQUEST)["scan_id"])
    console.print(f"submitted scan {scan_id} (docker tag latest, nsides 8:0 64:12 512:24)")
    console.print(f"  kubectl -n {os.environ.get('SKYSCAN_NAMESPACE', 'skyscan')} get scan {scan_id}")
    code = follow.follow(client.events(scan_id), console)
    if code != exit_codes.OK:
        console.print(f"the scan did not finish; see {folder / 'logs'}/", style="red")
        return code
    console.print(f"\nScan {scan_id}: final result after {time.monotonic() - began:.1f}s")
    result = client.result(scan_id)
    console.print(tables.result(scan_id, result))
    blocks: dict[str, Any] = result.get("scan_result") or {}
    first: dict[str, Any] = next(iter(blocks.values()), {})
    meta: dict[str, Any] = first.get("metadata") or {}
    console.print(f"event: run {meta.get('run_id')} event {meta.get('event_id')} ({meta.get('event_type')})")
    console.print("drawing the skymap with icecube-skyreader (a minute on a busy machine) ...")
    target = plot.write_skymap(blocks, folder / f"skymap-{scan_id}.png")
    console.print(f"skymap, full sky and zoom around the best fit:\n{target}")
    return exit_codes.OK


def main() -> int:
    console = Console(highlight=False, soft_wrap=True)
    folder = local_dir()
    try:
        with Client(env_file=folder / "env") as client:
            return run(client, console, folder)
    except ConfigError as e:
        print(f"{e}: run `make up` first", file=sys.stderr)
        return exit_codes.UNREACHABLE
    except (SkyscanError, Unreachable) as e:
        print(f"the REST API refused or did not answer: {e}", file=sys.stderr)
        return exit_codes.REFUSED
    except plot.PlotExtraMissing as e:
        print(str(e), file=sys.stderr)
        return exit_codes.NO_PLOT_EXTRA


if __name__ == "__main__":
    sys.exit(main())
