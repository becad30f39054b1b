"""`make audit-deps`: pip-audit over the lock file (every package as pinned, checked by hash), against
the vulnerability service it names (default: PyPI's JSON API, one request per pinned release).

Exit 1 when a locked version has a known vulnerability (each printed with the versions that fix it:
bump the pin with `make lock` after raising the pyproject's lower bound, or `UPGRADE=1`).

A package the service could not answer for is not audited, and that is said loudly at the end. Where
the service cannot be reached at all (a machine whose network reaches PyPI's package files but not its
per-release JSON, nor OSV), every package is unaudited: exit 0 with that said, unless
SKYSCAN_AUDIT_REQUIRED=1 (the upstream CI, which reaches them), where it is a failure.

    python tools/audit_deps.py requirements/venv.txt [pip-audit options, e.g. -s osv]
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any


def audit(lock: str, extra: list[str]) -> tuple[int, dict[str, Any] | None, str]:
    """pip-audit's exit code, its JSON report (None when it wrote none) and its stderr."""
    pip_audit = Path(sys.executable).with_name("pip-audit")
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        done = subprocess.run(
            [str(pip_audit), "--requirement", lock, "--require-hashes", "--disable-pip",
             "--progress-spinner", "off", "--format", "json", "--output", str(report), *extra],
            capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        data = json.loads(report.read_text()) if report.exists() and report.stat().st_size else None
    return done.returncode, data, done.stderr


def main(argv: list[str]) -> int:
    lock, extra = argv[0], argv[1:]
    required = os.environ.get("SKYSCAN_AUDIT_REQUIRED", "") not in ("", "0")
    code, data, stderr = audit(lock, extra)
    if data is None:  # no report: the service refused or was unreachable (pip-audit raised)
        last = stderr.strip().splitlines()[-1:] or [f"pip-audit exited {code}"]
        print(f"audit-deps: NOT AUDITED: pip-audit wrote no report ({last[0]})", file=sys.stderr)
        return 1 if required else 0

    deps = data.get("dependencies", [])
    vulnerable = [d for d in deps if d.get("vulns")]
    skipped = [d for d in deps if "skip_reason" in d]
    audited = len(deps) - len(skipped)
    for dep in vulnerable:
        for vuln in dep["vulns"]:
            fixes = ", ".join(vuln.get("fix_versions") or []) or "no fixed version yet"
            aliases = ", ".join(vuln.get("aliases") or [])
            print(f"VULNERABLE {dep['name']}=={dep['version']}: {vuln['id']}"
                  f"{f' ({aliases})' if aliases else ''}; fixed in: {fixes}")  # fmt: skip
    print(f"audit-deps: {len(deps)} locked packages ({lock}), {audited} audited, "
          f"{len(vulnerable)} with known vulnerabilities, {len(skipped)} not audited")  # fmt: skip
    if skipped:
        reasons = sorted({d["skip_reason"].split(":")[0] for d in skipped})
        names = ", ".join(d["name"] for d in skipped[:8])
        more = f" and {len(skipped) - 8} more" if len(skipped) > 8 else ""
        print(f"audit-deps: NOT AUDITED: {names}{more} ({'; '.join(reasons)})", file=sys.stderr)
        if not audited:
            print("audit-deps: the vulnerability service answered for no package: nothing was audited "
                  "(where PyPI's per-release JSON API is not served and OSV is not reached); "
                  "with SKYSCAN_AUDIT_REQUIRED=1 (the upstream CI) that fails",
                  file=sys.stderr)  # fmt: skip
    if vulnerable:
        return 1
    return 1 if skipped and required else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
