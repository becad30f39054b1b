"""containerd on the real node: the images it imports from the local builds (no registry), and at
stop the records of its dead containers and its shims, which outlive it."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
from pathlib import Path

from skyscan_local import host, processes
from skyscan_local.node_config import IMAGES, NodeError, Paths

REPO = Path(__file__).resolve().parents[2]
IMAGES_SCRIPT = REPO / "tools" / "node" / "images.sh"


def ensure_images() -> Path:
    """Build (or find) the node's images; returns their directory."""
    if override := os.environ.get("SKYSCAN_NODE_IMAGES_READY"):
        return Path(override)
    out = subprocess.run(["bash", str(IMAGES_SCRIPT)], check=True, stdout=subprocess.PIPE, text=True)
    return Path(out.stdout.strip().splitlines()[-1])


def ctr(p: Paths, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    argv = ["ctr", "--address", str(p.containerd_socket), "--namespace", "k8s.io", *args]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise NodeError(f"{' '.join(argv)}: {done.stderr.strip()[-800:]}")
    return done


def import_images(p: Paths, images_dir: Path) -> list[str]:
    """Import each image whose archive changed since its last import (the containerd root stays between
    runs); returns the names imported."""
    record = json.loads(p.images_imported.read_text()) if p.images_imported.exists() else {}
    present = set(ctr(p, "images", "list", "--quiet").stdout.split())
    imported = []
    for name in IMAGES:
        tar = (images_dir / f"{name}.tar").resolve()
        if record.get(name) == tar.name and f"localhost/{name}:dev" in present:
            continue
        ctr(p, "images", "import", "--no-unpack=false", str(tar))
        record[name] = tar.name
        p.images_imported.write_text(json.dumps(record))
        imported.append(name)
    return imported


def forget_containers(p: Paths) -> None:
    """Delete the dead Pods' containers from containerd's records (its root stays, for the images):
    the next start begins with none, as after a reboot with a clean runtime."""
    if not p.containerd_socket.exists():
        return
    for container in ctr(p, "containers", "list", "--quiet", timeout=30).stdout.split():
        with contextlib.suppress(NodeError):
            ctr(p, "tasks", "delete", "--force", container, timeout=30)
        ctr(p, "containers", "delete", container, timeout=30)


def kill_shims(p: Paths) -> None:
    """containerd's shims outlive it (they are reparented); ours name our containerd's socket."""
    pids = list(host.processes_with(str(p.containerd_socket)))
    processes.stop(
        [processes.Recorded(pid, tuple((processes.command_line(pid) or ["?"])[:1])) for pid in pids]
    )
