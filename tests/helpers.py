"""Helpers for tests: polling for a condition instead of sleeping; a real exec credential plugin."""

from __future__ import annotations

import asyncio
import base64
import json
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import yaml

from api_shim.find.match import Filter, compile_filter
from api_shim.find.query import FilterError, FindLimits, parse
from api_shim.find.regex import RegexError, compile_regex
from skyscan.io.kube_errors import KubeError
from skyscan.io.kubeconfig import Endpoint

T = TypeVar("T")


async def eventually(probe: Callable[[], Awaitable[T]], timeout: float = 30.0, interval: float = 0.2) -> T:
    """Await `probe()` until it returns a truthy value without raising; return that value."""
    deadline = time.monotonic() + timeout
    last: BaseException | None = None
    while time.monotonic() < deadline:
        try:
            if result := await probe():
                return result
        except (KubeError, AssertionError) as e:
            last = e
        await asyncio.sleep(interval)
    raise TimeoutError(f"condition not met within {timeout}s (last error: {last!r})")


# A real exec credential plugin (client.authentication.k8s.io/v1): it logs each run (its arguments, the
# SKYSCAN_PLUGIN_NOTE variable and KUBERNETES_EXEC_INFO) as a line of `runs` beside it, then answers as
# `answer.json` beside it says: {"fail": stderr text} exits 3; else `status` is printed, with an
# expirationTimestamp `lifetime` seconds from now when that is given.
PLUGIN = """
import datetime as dt, json, os, pathlib, sys
here = pathlib.Path(__file__).parent
with open(here / "runs", "a") as runs:
    note, info = os.environ.get("SKYSCAN_PLUGIN_NOTE"), json.loads(os.environ["KUBERNETES_EXEC_INFO"])
    runs.write(json.dumps({"args": sys.argv[1:], "note": note, "info": info}) + "\\n")
answer = json.loads((here / "answer.json").read_text())
if "fail" in answer:
    print(answer["fail"], file=sys.stderr)
    sys.exit(3)
status = answer["status"]
if "lifetime" in answer:
    expires = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=answer["lifetime"])
    status["expirationTimestamp"] = expires.strftime("%Y-%m-%dT%H:%M:%SZ")
version = "client.authentication.k8s.io/v1"
print(json.dumps({"apiVersion": version, "kind": "ExecCredential", "status": status}))
"""


# A kubeconfig user logging in with PLUGIN beside the kubeconfig (a command relative to the kubeconfig).
PLUGIN_USER = {
    "exec": {
        "apiVersion": "client.authentication.k8s.io/v1",
        "command": "./plugin.py",
        "interactiveMode": "Never",
    }
}


def exec_plugin(directory: Path) -> Path:
    """PLUGIN as an executable script in `directory` (run by this interpreter)."""
    script = directory / "plugin.py"
    script.write_text(f"#!{sys.executable}\n{PLUGIN}")
    script.chmod(0o755)
    return script


def plugin_answers(directory: Path, answer: dict[str, object]) -> None:
    (directory / "answer.json").write_text(json.dumps(answer))


def plugin_runs(directory: Path) -> list[dict[str, Any]]:
    runs = directory / "runs"
    return [json.loads(line) for line in runs.read_text().splitlines()] if runs.exists() else []


def kubeconfig(target: Endpoint, directory: Path, user: dict[str, Any]) -> str:
    """A kubeconfig in `directory` for `target`'s API server (and CA), its user `user`."""
    ca = {"certificate-authority-data": base64.b64encode(target.ca.encode()).decode()} if target.ca else {}
    doc = {
        "apiVersion": "v1", "kind": "Config", "current-context": "here",
        "clusters": [{"name": "here", "cluster": {"server": target.server, **ca}}],
        "contexts": [{"name": "here", "context": {"cluster": "here", "user": "robot"}}],
        "users": [{"name": "robot", "user": user}],
    }  # fmt: skip
    (directory / "kubeconfig").write_text(yaml.safe_dump(doc))
    return str(directory / "kubeconfig")


def find_filter(doc: Any, limits: FindLimits | None = None) -> Filter:
    """A find filter parsed and compiled with all its patterns, as a find compiles it; FilterError when
    it is invalid (its patterns included)."""
    limits = limits or FindLimits()
    query = parse(doc, limits)
    try:
        compiled = {
            p: compile_regex(
                p.pattern, p.options, max_length=limits.max_regex_length, max_program=limits.max_regex_program
            )
            for p in query.patterns()
        }
    except RegexError as e:
        raise FilterError(f"invalid $regex: {e}") from None
    return compile_filter(query, compiled)


def matcher(doc: Any) -> Callable[[Any], bool]:
    return find_filter(doc).matches
