"""The whole service on one machine: `make up` / `make down` (`python -m skyscan_local.stack up|down|status`).

`up` brings the stack to the requested configuration and is safe to repeat:
  control plane (or the cluster of SKYSCAN_KUBECONFIG) -> Scan CRD -> namespace, scanner token Secret
  -> PostgreSQL archive (or the one of SKYSCAN_LOCAL_ARCHIVE_DSN) -> WMS simulator -> REST shim
  -> operator -> scanner simulator (SIMULATE_SCANNER=1; `make up` sets it unless told 0)
Each component is a background process (new session, log in `.skyscan/logs/`); `.skyscan/stack.json`
records its pid, command line and configuration. A component already running with the same
configuration is left alone; one whose configuration changed is restarted. Each must pass its
readiness check before the next starts. `up` ends by writing `.skyscan/env` (mode 0600).
The shim and the operator share a generated presign key (`.skyscan/presign.key`, mode 0600) for the
workers' presigned startup.json URLs; the WMS simulator's workers fetch through them.

`down` stops exactly the recorded processes (a pid counts only while its command line is still the
recorded one), then PostgreSQL and the local control plane if `up` started them. PostgreSQL's data
(`.skyscan/postgres`) stays for the next `up`: it holds the archived history.

Every component setting can be overridden from the environment: `up` starts from `LOCAL_DEFAULTS`
and lets any variable already set in the environment win (docs/development/local-stack.md, "Local settings").
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import fcntl
import hashlib
import json
import os
import shlex
import shutil
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import yaml

from skyscan_local import control_plane as localcluster
from skyscan_local import postgres, processes
from skyscan_local import scanner_simulator as scanner_sim
from skyscan_local.processes import tail as tail  # the e2e tests read logs through it
from skyscan_local.stack_provision import (
    StackError,
    ensure_archive,
    ensure_cluster,
    ensure_presign_key,
    ensure_tokens,
    new_login_link,
    prepare_cluster,
)
from skyscan_local.stack_settings import (
    ENV_FILE,
    LOCK_FILE,
    PRESIGN_KEY_FILE,
    STATE_FILE,
    TOKEN_FILE,
    UI_LOGIN_FILE,
)

# The settings, which the real stack and the tests read here with the stack.
from skyscan_local.stack_settings import ENV_KEYS as ENV_KEYS
from skyscan_local.stack_settings import LOCAL_DEFAULTS as LOCAL_DEFAULTS
from skyscan_local.stack_settings import LocalStackSettings as LocalStackSettings

REPO = Path(__file__).resolve().parents[2]


@dataclass
class Component:
    name: str
    argv: list[str]
    env: dict[str, str]  # the SKYSCAN_* configuration it gets (on top of the inherited environment)
    ready: Callable[[], bool]
    reads: tuple[Path, ...] = ()  # files it reads once, at start: the kubeconfig and the CA it names

    @property
    def config(self) -> str:
        """Its command line, settings, the files it reads at start and the code it runs: a change to
        any of them restarts it (a control plane's renewed CA, too)."""
        files = [hashlib.sha256(f.read_bytes()).hexdigest() if f.exists() else "" for f in self.reads]
        identity = json.dumps([self.argv, sorted(self.env.items()), files, code_version()])
        return hashlib.sha256(identity.encode()).hexdigest()[:16]


def kubeconfig_files(kubeconfig: str) -> tuple[Path, ...]:
    """A kubeconfig and the CA files it names: what a component trusts the API server by."""
    path = Path(kubeconfig)
    clusters = (yaml.safe_load(path.read_text()) or {}).get("clusters") or []
    named = [c.get("cluster", {}).get("certificate-authority") for c in clusters]
    return (path, *(path.parent / ca for ca in named if ca))


def code_version() -> str:
    """Changes whenever a source file of the product or the harness changes (so `make up` picks up
    edits)."""
    roots = ("skyscan", "operator", "api_shim", "local")
    files = sorted(f for root in roots for f in (REPO / root).rglob("*.py"))
    stamps = [(str(f.relative_to(REPO)), f.stat().st_mtime_ns, f.stat().st_size) for f in files]
    return hashlib.sha256(json.dumps(stamps).encode()).hexdigest()[:16]


# --- processes ------------------------------------------------------------------------------------


def _recorded(record: dict[str, Any]) -> processes.Recorded:
    return processes.Recorded(int(record["pid"]), tuple(record["argv"]))


def alive(record: dict[str, Any]) -> bool:
    """The recorded process still runs (and its pid was not recycled by another program)."""
    return _recorded(record).alive()


def stop_process(record: dict[str, Any], timeout: float = 15.0) -> None:
    processes.stop([_recorded(record)], timeout)


# --- readiness checks -----------------------------------------------------------------------------


def http_ok(url: str) -> Callable[[], bool]:
    return lambda: httpx.get(url, timeout=2).status_code == 200


def log_says(log: Path, line: str) -> Callable[[], bool]:
    return lambda: line in processes.this_run(log)


# --- the stack ------------------------------------------------------------------------------------


def merged(defaults: dict[str, str], forced: dict[str, str], overrides: dict[str, str]) -> dict[str, str]:
    """Local defaults < the caller's SKYSCAN_* environment < what the stack decides < test overrides.

    The whole SKYSCAN_* environment is part of a component's configuration, so changing any of it
    restarts the component on the next `make up`; the values of a sourced `.skyscan/env` are not."""
    inherited = {k: v for k, v in os.environ.items() if k.startswith("SKYSCAN_") and k not in ENV_KEYS}
    return {**defaults, **inherited, **forced, **overrides}


def components(s: LocalStackSettings, state: dict[str, Any]) -> list[Component]:
    py, logs = sys.executable, s.dir / "logs"
    ports, kubeconfig = state["ports"], state["kubeconfig"]
    shim_url = f"http://127.0.0.1:{ports['shim']}"
    wms_url = f"http://127.0.0.1:{ports['wms']}"
    where = {
        "SKYSCAN_KUBECONFIG": kubeconfig, "SKYSCAN_NAMESPACE": s.namespace,
        "SKYSCAN_ARCHIVE_DSN": state["archive_dsn"],
    }  # fmt: skip
    presign_key = {"SKYSCAN_PRESIGN_KEY_FILE": str(s.dir / PRESIGN_KEY_FILE)}  # the shim's and the operator's
    trust = kubeconfig_files(kubeconfig)
    stack = [
        Component(
            "wms-simulator",
            [py, "-m", "skyscan_local.wms_simulator", "--host", "127.0.0.1", "--port", str(ports["wms"])],
            merged(LOCAL_DEFAULTS["wms-simulator"], {}, s.overrides_for("wms-simulator")),
            http_ok(f"{wms_url}/.well-known/openid-configuration"),
        ),
        Component(
            "shim",
            [py, "-m", "api_shim.app", "serve"],
            merged(
                LOCAL_DEFAULTS["shim"],
                {
                    **where,
                    **presign_key,
                    "SKYSCAN_PORT": str(ports["shim"]),
                    "SKYSCAN_TOKEN_FILE": str(s.dir / TOKEN_FILE),
                    "SKYSCAN_UI_LOGIN_FILE": str(s.dir / UI_LOGIN_FILE),
                },
                s.overrides_for("shim"),
            ),
            http_ok(f"{shim_url}/healthz"),
            trust,
        ),
    ]
    operator_health = f"http://127.0.0.1:{ports['operator']}/healthz"
    operator_env = {
        **where,
        **presign_key,
        "SKYSCAN_LIVENESS_ENDPOINT": operator_health,
        "SKYSCAN_METRICS_PORT": str(ports["operator_metrics"]),
        "SKYSCAN_METRICS_HOST": "127.0.0.1",  # the machine's other users have no business there
        "SKYSCAN_WMS_ADDRESS": wms_url,
        "SKYSCAN_REST_ADDRESS": shim_url,
    }
    if s.simulate_scanner:
        operator_env["SKYSCAN_SCANNER_POD_ANNOTATIONS"] = json.dumps({localcluster.HOLD_ANNOTATION: "true"})
    stack.append(
        Component(
            "operator",
            [py, "-m", "skyscan_operator.handlers"],
            merged(LOCAL_DEFAULTS["operator"], operator_env, s.overrides_for("operator")),
            http_ok(operator_health),  # kopf's liveness endpoint
            trust,
        )
    )
    if s.simulate_scanner:
        sim_env = {"SKYSCAN_SCANNER_SIM_NAMESPACE": s.namespace, "SKYSCAN_SCANNER_SIM_KUBECONFIG": kubeconfig}
        stack.append(
            Component(
                "scanner-simulator",
                [py, "-m", "skyscan_local.scanner_simulator"],
                merged(LOCAL_DEFAULTS["scanner-simulator"], sim_env, s.overrides_for("scanner-simulator")),
                log_says(logs / "scanner-simulator.log", scanner_sim.READY_LINE),
                trust,
            )
        )
    return stack


def load_state(d: Path) -> dict[str, Any]:
    f = d / STATE_FILE
    return dict(json.loads(f.read_text())) if f.exists() else {}


def save_state(d: Path, state: dict[str, Any]) -> None:
    processes.write_private(d / STATE_FILE, json.dumps(state, indent=2))  # it holds the local tokens


def env_lines(state: dict[str, Any], namespace: str) -> dict[str, str]:
    return {
        "SKYSCAN_URL": f"http://127.0.0.1:{state['ports']['shim']}",
        "SKYSCAN_USER_TOKEN": state["tokens"]["user"],
        "SKYSCAN_SYSTEM_TOKEN": state["tokens"]["system"],
        "SKYSCAN_REFERENCE_TOKEN": state["tokens"]["reference"],
        "SKYSCAN_VIEWER_TOKEN": state["tokens"]["viewer"],
        "SKYSCAN_WMS_URL": f"http://127.0.0.1:{state['ports']['wms']}",
        "KUBECONFIG": state["kubeconfig"],
        "SKYSCAN_NAMESPACE": namespace,
        "SKYSCAN_ARCHIVE_DSN": state["archive_dsn"],
        "SKYSCAN_OPERATOR_METRICS_URL": f"http://127.0.0.1:{state['ports']['operator_metrics']}/metrics",
    }


def write_env(d: Path, values: dict[str, str]) -> Path:
    f = d / ENV_FILE
    processes.write_private(f, "".join(f"export {k}={shlex.quote(values[k])}\n" for k in ENV_KEYS))
    return f


@contextlib.contextmanager
def locked(d: Path) -> Iterator[None]:
    """One `up`, `down` or `restart` at a time per stack directory: two at once would both start a
    component on the same port, and the loser would report it "exited during start-up" while the
    winner's copy listens."""
    d.mkdir(parents=True, exist_ok=True)
    with (d / LOCK_FILE).open("a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


def start(s: LocalStackSettings, state: dict[str, Any], component: Component) -> None:
    """Spawn one component, record it, and wait until it is ready."""
    log = s.dir / "logs" / f"{component.name}.log"
    proc = processes.spawn(component.argv, log, env=component.env, tie_to_parent=s.tie_to_parent)
    state["components"][component.name] = {
        "pid": proc.pid,
        "argv": component.argv,
        "config": component.config,
    }
    save_state(s.dir, state)
    processes.wait_until(
        component.ready, component.name, s.ready_timeout, proc=proc, log=log, error=StackError
    )


def up(s: LocalStackSettings) -> dict[str, str]:
    """Bring the stack to the requested configuration; returns the values written to `.skyscan/env`."""
    with locked(s.dir):
        return _up(s)


def _up(s: LocalStackSettings) -> dict[str, str]:
    state = load_state(s.dir)
    serving = any(alive(r) for r in (state.get("components") or {}).values())
    if serving and state.get("namespace") not in (None, s.namespace):
        raise StackError(f"the stack in {s.dir} serves namespace {state['namespace']}; run `make down` first")
    state["kubeconfig"] = ensure_cluster(s, state)
    state["namespace"] = s.namespace
    records: dict[str, dict[str, Any]] = state.setdefault("components", {})
    running = {name for name, r in records.items() if alive(r)}
    ports = state.get("ports") or {}

    def port(name: str, component: str, preferred: int) -> int:
        had = ports.get(name)
        return processes.choose_port(None if had is None else int(had), preferred, keeps=component in running)

    state["ports"] = {
        "shim": port("shim", "shim", s.shim_port),
        "wms": port("wms", "wms-simulator", s.wms_port),
        "operator": port("operator", "operator", 0),  # kopf's liveness endpoint
        "operator_metrics": port("operator_metrics", "operator", 0),
    }
    state["tokens"] = ensure_tokens(s, state)
    ensure_presign_key(s)
    save_state(s.dir, state)
    state["archive_dsn"] = ensure_archive(s, state)
    save_state(s.dir, state)
    asyncio.run(prepare_cluster(state["kubeconfig"], s.namespace, s.ready_timeout))

    wanted = components(s, state)
    for name in [n for n in reversed(list(records)) if n not in {c.name for c in wanted}]:
        print(f"stopping {name} (not wanted now)", file=sys.stderr)
        stop_process(records.pop(name))
        save_state(s.dir, state)
    for component in wanted:
        record = records.get(component.name)
        if record and alive(record) and record["config"] == component.config:
            continue
        if record:
            print(f"restarting {component.name} (configuration changed or not running)", file=sys.stderr)
            stop_process(record)
        if component.name == "shim":  # a new shim knows no code as spent: the links made before go
            (s.dir / UI_LOGIN_FILE).unlink(missing_ok=True)
        start(s, state, component)
    values = env_lines(state, s.namespace)
    write_env(s.dir, values)
    # Not in the env file: a link works once, and a new `make up` makes another.
    return {
        **values,
        "SKYSCAN_UI_LOGIN_LINK": new_login_link(s, state["tokens"]["user"], values["SKYSCAN_URL"]),
    }


def kill(s: LocalStackSettings, name: str) -> None:
    """SIGKILL one recorded component, as a crash would."""
    processes.kill(_recorded(load_state(s.dir)["components"][name]))


def restart(s: LocalStackSettings, name: str) -> None:
    """Start one component again as `up` configured it (its ports and settings; stopped first if it
    runs), leaving the others alone even if code changed since: tests crash one and bring it back."""
    with locked(s.dir):
        state = load_state(s.dir)
        stop_process(state["components"][name])
        start(s, state, next(c for c in components(s, state) if c.name == name))


def down(s: LocalStackSettings) -> list[str]:
    """Stop what `up` recorded, newest first; returns the names of the components that were running."""
    with locked(s.dir):
        return _down(s)


def _down(s: LocalStackSettings) -> list[str]:
    """Stops processes only: the cluster's etcd, PostgreSQL's data, the ports, tokens and keys stay,
    and the next `up` starts the same stack again."""
    state = load_state(s.dir)
    stopped = []
    for name, record in reversed(list((state.get("components") or {}).items())):
        if alive(record):
            stopped.append(name)
        stop_process(record)
    if state.get("local_postgres", not s.archive_dsn) and postgres.stop(s.postgres_dir):
        stopped.append("postgres")
    if state.get("local_cluster", not s.kubeconfig) and (cluster := localcluster.load(s.cluster_dir)):
        if cluster.running():
            stopped.append("control plane")
        localcluster.stop(s.cluster_dir)
    return stopped


def reset(s: LocalStackSettings) -> list[str]:
    """Delete a stopped stack: the local cluster (every Scan in its etcd), the local PostgreSQL's data
    (the archive), logs, tokens and keys. Refused while anything of it runs. Returns what it deleted."""
    with locked(s.dir):
        if running := [name for name, up in status(s).items() if up]:
            raise StackError(f"still running: {', '.join(running)}; run `make down` first")
        if (cluster := localcluster.load(s.cluster_dir)) and cluster.running():
            raise StackError("the control plane still runs; run `make down` first")
        deleted = [str(p) for p in (s.cluster_dir, s.postgres_dir, s.dir / "logs") if p.exists()]
        localcluster.remove(s.cluster_dir)
        for d in (s.postgres_dir, s.dir / "logs"):
            shutil.rmtree(d, ignore_errors=True)
        for name in (STATE_FILE, ENV_FILE, TOKEN_FILE, PRESIGN_KEY_FILE):
            if (s.dir / name).exists():
                deleted.append(str(s.dir / name))
                (s.dir / name).unlink()
        return deleted


def status(s: LocalStackSettings) -> dict[str, bool]:
    state = load_state(s.dir)
    running = {name: alive(r) for name, r in (state.get("components") or {}).items()}
    if state.get("local_postgres"):
        server = postgres.load(s.postgres_dir)
        running["postgres"] = bool(server and server.running())
    return running


def _without_password(dsn: str) -> str:
    parts = urlsplit(dsn)
    host = parts.netloc.rpartition("@")[2]
    return parts._replace(netloc=f"{parts.username}@{host}" if parts.username else host).geturl()


def usage(values: dict[str, str], env_file: Path, simulate: bool) -> str:
    sim = "on" if simulate else "off (scans wait for a scanner that never reports: make up runs it)"
    return f"""
Skyscan is up. Scanner simulator: {sim}.
  REST API        {values["SKYSCAN_URL"]}   (spec: {values["SKYSCAN_URL"]}/openapi.json)
  dashboard       {values["SKYSCAN_URL"]}/ui/
  login link      {values["SKYSCAN_UI_LOGIN_LINK"]}   (once, within 15 minutes)
  WMS simulator   {values["SKYSCAN_WMS_URL"]}
  namespace       {values["SKYSCAN_NAMESPACE"]}
  archive         {_without_password(values["SKYSCAN_ARCHIVE_DSN"])}   (psql "$SKYSCAN_ARCHIVE_DSN")
  logs            {env_file.parent / "logs"}/

  source {env_file}
  curl -H "Authorization: Bearer $SKYSCAN_USER_TOKEN" $SKYSCAN_URL/scans/backlog
  kubectl -n $SKYSCAN_NAMESPACE get scans
  make demo        # a scan from submission to final result
  make down        # stop everything
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="skyscan-local", description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=["up", "down", "status", "reset"])
    args = parser.parse_args(argv)
    settings = LocalStackSettings()
    if args.command == "down":
        stopped = down(settings)
        print(f"stopped: {', '.join(stopped)}" if stopped else "nothing was running")
        print(f"(data kept in {settings.dir}; `make up` starts the same stack, `make reset` deletes it)")
        return 0
    if args.command == "reset":
        try:
            deleted = reset(settings)
        except StackError as e:
            print(f"make reset refused: {e}", file=sys.stderr)
            return 1
        print("deleted:\n  " + "\n  ".join(deleted) if deleted else "nothing to delete")
        return 0
    if args.command == "status":
        running = status(settings)
        for name, ok in running.items():
            print(f"{name:18} {'running' if ok else 'NOT running'}")
        return 0 if running and all(running.values()) else 1
    began = time.monotonic()
    try:
        values = up(settings)
    except (StackError, localcluster.ClusterError) as e:
        print(f"make up failed: {e}", file=sys.stderr)
        return 1
    print(usage(values, settings.dir / ENV_FILE, settings.simulate_scanner))
    print(f"(ready in {time.monotonic() - began:.1f}s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
