"""`make lint`'s check that a Scan's spec and status are read through their accessors
(tools/raw_access.py)."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))

import raw_access  # noqa: E402


def test_a_raw_read_of_a_scans_spec_or_status_is_found_and_a_named_other_kind_is_not(tmp_path: Path) -> None:
    module = tmp_path / "probe.py"
    module.write_text(
        'def f(scan, lease):\n    a = scan["spec"]\n    b = scan.get("status")\n'
        '    c = lease["spec"]  # raw: Lease\n    d = scan["metadata"]\n    return a, b, c, d\n'
    )
    found = raw_access.check(ROOT, [module])
    assert [line.split(": ", 1)[0] for line in found] == [f"{module}:2", f"{module}:3"]


def test_the_accessor_modules_are_exempt_and_the_product_has_no_raw_access() -> None:
    assert raw_access.check(ROOT, [ROOT / "skyscan" / "scan_record.py"]) == []
    assert raw_access.main([]) == 0
