"""What `up` provisions before it starts the components: the cluster (the local control plane or the
one given), the archive (the local PostgreSQL or the one given), the namespace ready for Scans, the
local tokens and the presign key."""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import time
from pathlib import Path
from typing import Any

from api_shim.auth import token_hash
from skyscan.io import install, kube
from skyscan.io.kube_errors import Conflict, NotFound
from skyscan_local import control_plane as localcluster
from skyscan_local import postgres, processes
from skyscan_local.stack_settings import (
    ARCHIVE_DATABASE,
    PRESIGN_KEY_FILE,
    TOKEN_FILE,
    UI_LOGIN_FILE,
    LocalStackSettings,
)


class StackError(RuntimeError):
    pass


def ensure_cluster(s: LocalStackSettings, state: dict[str, Any]) -> str:
    if s.kubeconfig:
        state["local_cluster"] = False
        return str(Path(s.kubeconfig).expanduser().resolve())
    state["local_cluster"] = True
    return localcluster.ensure(s.cluster_dir, tie_to_parent=s.tie_to_parent).kubeconfig


def ensure_archive(s: LocalStackSettings, state: dict[str, Any]) -> str:
    """The archive's DSN: the given one, or database `skyscan` on the local PostgreSQL (started if
    it is not running; its data is kept across `down` and `up`) with its least-privilege role
    `skyscan` (provisioned at each `up`: an archive made as the superuser is handed over to it)."""
    if s.archive_dsn:
        state["local_postgres"] = False
        return s.archive_dsn
    state["local_postgres"] = True
    try:
        server = postgres.ensure(s.postgres_dir, port=s.postgres_port, tie_to_parent=s.tie_to_parent)
        return asyncio.run(postgres.ensure_app_login(server, database=ARCHIVE_DATABASE))
    except postgres.PostgresError as e:
        raise StackError(str(e)) from e


async def prepare_cluster(kubeconfig: str, namespace: str, timeout: float) -> None:
    """The CRDs, the namespace (ready for Pods), the scanners' ServiceAccount, the webhook Secret."""
    await install.install(kubeconfig)
    async with await kube.connect(kubeconfig) as api:
        with contextlib.suppress(Conflict):
            await api.request("POST", kube.core_path("namespaces"), body={"metadata": {"name": namespace}})
        deadline = time.monotonic() + timeout
        while True:
            try:
                await api.request("GET", kube.core_path("serviceaccounts", namespace, "default"))
                break
            except NotFound:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.2)
        await install.ensure_scanner_account(api, namespace)
        await install.ensure_webhook_secrets(api, namespace)


def ensure_tokens(s: LocalStackSettings, state: dict[str, Any]) -> dict[str, str]:
    from api_shim import auth  # the shim's own token file format
    from api_shim.wire_names import Names

    token_file = s.dir / TOKEN_FILE
    if {"user", "system", "reference", "viewer"} <= set(state.get("tokens") or {}) and token_file.exists():
        return dict(state["tokens"])
    token_file.unlink(missing_ok=True)
    return {
        "user": auth.make_token(token_file, "local-user", [auth.USER]),
        "system": auth.make_token(token_file, "local-scanner", [auth.SYSTEM]),
        # A user answered in the reference's names: what IceCube's own scripts read.
        "reference": auth.make_token(token_file, "local-icecube-client", [auth.USER], Names.REFERENCE),
        # A person who may read and change nothing (the dashboard shows them no action).
        "viewer": auth.make_token(token_file, "local-viewer", [auth.VIEWER]),
    }


def ensure_presign_key(s: LocalStackSettings) -> Path:
    """The key signing the workers' startup.json URLs; kept across `up`s (so nothing restarts)."""
    key_file = s.dir / PRESIGN_KEY_FILE
    processes.kept_secret(key_file, 32)
    return key_file


LOGIN_LINK_SECONDS = 900


def new_login_link(s: LocalStackSettings, token: str, shim_url: str) -> str:
    """A one-time dashboard login link that opens `token`, for `LOGIN_LINK_SECONDS`: the code's hash, the
    token and the expiry written whole (mode 0600) where the shim reads them. Links printed before that
    have not expired keep working (`make demo` runs `make up` again, which makes a new one), once each."""
    path, now = s.dir / UI_LOGIN_FILE, time.time()
    try:
        kept = json.loads(path.read_text())["codes"]
        codes = {h: c for h, c in kept.items() if c["expires_at"] > now}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):  # none yet, or not ours to read
        codes = {}
    code = secrets.token_urlsafe(24)
    codes[token_hash(code)] = {"token": token, "expires_at": now + LOGIN_LINK_SECONDS}
    processes.write_private(path, json.dumps({"codes": codes}))
    return f"{shim_url}/ui/#code={code}"
