"""`make lint`'s check that a Scan's spec and status are read through their typed accessors only
(`skyscan.scan_record.ScanRecord`, the models of `skyscan.model`), never as raw `obj["spec"]`/`obj["status"]`
or `obj.get("spec")`/`obj.get("status")` in product code: a renamed or retyped key then has one place
to change. Other objects' keys (a Lease's spec, a Job's or a condition's status) are named as such on
their line with `# raw: <kind>`; the accessor modules themselves are exempt.

    python tools/raw_access.py [paths...]   # exit 1, listing each raw access, if there is any
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

PRODUCT = ("skyscan", "operator/skyscan_operator", "api_shim")
ACCESSORS = {
    "skyscan/scan_record.py",  # ScanRecord: the Scan's typed reads
    "skyscan/conditions.py",  # a condition's own `status` field
    "operator/skyscan_operator/lease.py",  # the Lease's spec
}
KEYS = {"spec", "status"}
PRAGMA = "# raw:"


def raw_accesses(source: str) -> Iterator[int]:
    """Line numbers of `x["spec"]`, `x["status"]`, `x.get("spec")` and `x.get("status")`."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Subscript):
            key = node.slice
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("get", "setdefault", "pop")
            and node.args
        ):
            key = node.args[0]
        else:
            continue
        if isinstance(key, ast.Constant) and key.value in KEYS:
            yield node.lineno


def check(root: Path, files: list[Path]) -> list[str]:
    found = []
    for path in files:
        resolved = path.resolve()
        relative = resolved.relative_to(root).as_posix() if resolved.is_relative_to(root) else str(path)
        if relative in ACCESSORS:
            continue
        source = path.read_text()
        lines = source.splitlines()
        for line in sorted(set(raw_accesses(source))):
            if PRAGMA not in lines[line - 1]:
                found.append(f"{relative}:{line}: {lines[line - 1].strip()}")
    return found


def main(argv: list[str]) -> int:
    root = Path(__file__).resolve().parent.parent
    files = [Path(a) for a in argv] or [p for d in PRODUCT for p in sorted((root / d).rglob("*.py"))]
    found = check(root, files)
    for line in found:
        print(line)
    if found:
        print(
            f"{len(found)} raw spec/status access(es): read a Scan through skyscan.scan_record.ScanRecord "
            "(or add an accessor there); for another kind of object, say which on the line: "
            f"`{PRAGMA} <kind>`",
            file=sys.stderr,
        )
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
