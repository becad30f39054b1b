"""A thin async client for the Kubernetes API server, on aiohttp: JSON in, JSON (or raw bytes) out.

Everything we ask of the API server is a handful of REST calls on plain dicts; a generated client
costs the operator ~36 MiB and the shim ~0.35 s of import for nothing we use. `Kube` holds one
aiohttp session (no `trust_env`: the API server is reached directly, and netrc/proxy lookups would
hop to a thread on every call), authenticated by the kubeconfig's client certificate or bearer token,
or in-cluster by the pod's service-account token (re-read as the kubelet rotates it).

    async with await connect(kubeconfig) as kube:
        scan = await kube.request("GET", scan_path("ns", "s-1"))
        await kube.request("PATCH", scan_path("ns", "s-1", "status"), body=..., content_type=MERGE_PATCH)
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import ssl
import tempfile
import time
from collections.abc import AsyncIterator, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import aiohttp
import yaml

from skyscan import model

JSON = "application/json"
MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"
# A watch event or a payload ConfigMap can carry an object up to etcd's request limit (1.5 MiB).
READ_BUFSIZE = 2**21
# Re-read a token file this often: the kubelet rotates projected service-account tokens well before
# they expire (client-go re-reads every minute too).
TOKEN_REREAD_SECONDS = 60.0
IN_CLUSTER = Path("/var/run/secrets/kubernetes.io/serviceaccount")

Params = Mapping[str, Any]  # str, int or bool values; None ones are left out


class WatchIdle(Exception):
    """A watch's stream brought nothing, not even a bookmark, for longer than the caller allows."""


class ApiError(Exception):
    """A non-2xx answer of the API server: its status, reason phrase and body."""

    def __init__(self, status: int, reason: str, body: bytes = b"") -> None:
        super().__init__(f"{status} {reason}")
        self.status = status
        self.reason = reason
        self.body = body

    @property
    def message(self) -> str:
        """The message of the Status the API server answered with, else the body as text."""
        text = self.body.decode(errors="replace")
        try:
            found = json.loads(text)
        except ValueError:
            return text
        return str(found.get("message") or text) if isinstance(found, dict) else text


# ------------------------------------------------------------------------------ paths
def path(api: str, plural: str, namespace: str | None = None, name: str | None = None,
         subresource: str | None = None) -> str:  # fmt: skip
    """A resource's path: `api` is "v1" (the core group) or "group/version"."""
    parts = ["/api/v1" if api == "v1" else f"/apis/{api}"]
    if namespace is not None:
        parts.append(f"namespaces/{namespace}")
    parts.append(plural)
    if name is not None:
        parts.append(name)
        if subresource is not None:
            parts.append(subresource)
    return "/".join(parts)


def core_path(plural: str, namespace: str | None = None, name: str | None = None,
              subresource: str | None = None) -> str:  # fmt: skip
    return path("v1", plural, namespace, name, subresource)


def scan_path(namespace: str, name: str | None = None, subresource: str | None = None) -> str:
    return path(f"{model.GROUP}/{model.VERSION}", model.PLURAL, namespace, name, subresource)


def query(params: Params | None) -> dict[str, str]:
    """Query parameters as the API server spells them (booleans lower case); None values left out."""
    out: dict[str, str] = {}
    for key, value in (params or {}).items():
        if value is None:
            continue
        out[key] = ("true" if value else "false") if isinstance(value, bool) else str(value)
    return out


def lines(pending: list[bytes], chunk: bytes) -> Iterator[bytes]:
    """The complete lines that `chunk` ends, given the unfinished line's earlier parts in `pending`
    (updated in place to hold the new unfinished part). Joins each line once, whatever its size."""
    if b"\n" not in chunk:
        pending.append(chunk)
        return
    first, *rest = chunk.split(b"\n")
    pending.append(first)
    yield b"".join(pending)
    pending[:] = [rest.pop()]
    yield from rest


# ------------------------------------------------------------------------------ credentials
@dataclass(frozen=True)
class Endpoint:
    """Where the API server is and how to prove who we are (PEM text, or None)."""

    server: str
    ca: str | None = None
    cert: str | None = None
    key: str | None = None
    token: str | None = None
    token_file: str | None = None
    verify: bool = True


def _named(entries: Iterable[dict[str, Any]] | None, name: str | None, kind: str) -> dict[str, Any]:
    for entry in entries or ():
        if entry.get("name") == name:
            found: dict[str, Any] = entry.get(kind) or {}
            return found
    raise ValueError(f"kubeconfig has no {kind} {name!r}")


def _pem(section: dict[str, Any], key: str, base: Path) -> str | None:
    """The `<key>-data` (base64) or `<key>` (a file, relative to the kubeconfig) of a section."""
    if data := section.get(f"{key}-data"):
        return base64.b64decode(data).decode()
    if file := section.get(key):
        return (base / str(file)).read_text()
    return None


def endpoint_of_kubeconfig(doc: dict[str, Any], base: Path, context: str | None = None) -> Endpoint:
    """The current (or named) context of a parsed kubeconfig; files are read relative to `base`."""
    ctx = _named(doc.get("contexts"), context or doc.get("current-context"), "context")
    cluster = _named(doc.get("clusters"), ctx.get("cluster"), "cluster")
    user = _named(doc.get("users"), ctx["user"], "user") if ctx.get("user") else {}
    if "exec" in user or "auth-provider" in user:
        raise ValueError("kubeconfig users with exec or auth-provider plugins are not supported")
    token_file = user.get("tokenFile")
    return Endpoint(
        server=str(cluster["server"]).rstrip("/"),
        ca=_pem(cluster, "certificate-authority", base),
        cert=_pem(user, "client-certificate", base),
        key=_pem(user, "client-key", base),
        token=str(user["token"]) if user.get("token") else None,
        token_file=str(base / token_file) if token_file else None,
        verify=not cluster.get("insecure-skip-tls-verify", False),
    )


def endpoint_in_cluster(env: Mapping[str, str], root: Path = IN_CLUSTER) -> Endpoint | None:
    """The pod's own service account, or None outside a cluster."""
    host, port = env.get("KUBERNETES_SERVICE_HOST"), env.get("KUBERNETES_SERVICE_PORT")
    if not host or not port or not (root / "token").exists():
        return None
    host = f"[{host}]" if ":" in host else host  # IPv6
    return Endpoint(
        server=f"https://{host}:{port}", ca=(root / "ca.crt").read_text(), token_file=str(root / "token")
    )


def ssl_context(endpoint: Endpoint) -> ssl.SSLContext | None:
    if not endpoint.server.startswith("https:"):
        return None
    context = ssl.create_default_context(cadata=endpoint.ca) if endpoint.ca else ssl.create_default_context()
    if not endpoint.verify:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    if endpoint.cert and endpoint.key:
        # The ssl module loads a certificate chain from files only: a private directory, gone at once.
        with tempfile.TemporaryDirectory() as tmp:
            cert, key = Path(tmp) / "cert.pem", Path(tmp) / "key.pem"
            cert.write_text(endpoint.cert)
            key.touch(0o600)
            key.write_text(endpoint.key)
            context.load_cert_chain(cert, key)
    return context


class _Token:
    """A bearer token: fixed, or a file re-read every TOKEN_REREAD_SECONDS."""

    def __init__(self, value: str | None, file: str | None) -> None:
        self._value, self._file, self._read_at = value, file, 0.0

    def header(self) -> str | None:
        if self._file and time.monotonic() - self._read_at > TOKEN_REREAD_SECONDS:
            self._value = Path(self._file).read_text().strip()
            self._read_at = time.monotonic()
        return f"Bearer {self._value}" if self._value else None


# ------------------------------------------------------------------------------ the client
class Kube:
    """One API server, one aiohttp session. Create it with `connect`; close it (or `async with`)."""

    def __init__(self, endpoint: Endpoint) -> None:
        self.server = endpoint.server
        self._token = _Token(endpoint.token, endpoint.token_file)
        context = ssl_context(endpoint)
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=context if context is not None else False),
            trust_env=False,
            read_bufsize=READ_BUFSIZE,
            timeout=aiohttp.ClientTimeout(),  # none by default: a call's `timeout` bounds it
        )

    async def __aenter__(self) -> Kube:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def close(self) -> None:
        await self._session.close()

    def _headers(self, accept: str, content_type: str | None) -> dict[str, str]:
        headers = {"Accept": accept}
        if content_type:
            headers["Content-Type"] = content_type
        if auth := self._token.header():
            headers["Authorization"] = auth
        return headers

    async def read(
        self, method: str, path: str, *, params: Params | None = None, body: Any = None,
        content_type: str = JSON, accept: str = JSON, timeout: float | None = None,
        idle: float | None = None,
    ) -> bytes:  # fmt: skip
        """The raw body of a 2xx answer (else `ApiError`); `body` is sent as JSON unless bytes.
        `timeout` bounds the whole call, `idle` each wait for the answer's next bytes (a long listing
        may take its time, a server that stopped answering may not)."""
        data = body if body is None or isinstance(body, bytes) else json.dumps(body).encode()
        async with self._session.request(
            method, self.server + path, params=query(params), data=data,
            headers=self._headers(accept, content_type if data is not None else None),
            timeout=aiohttp.ClientTimeout(total=timeout, sock_read=idle),
        ) as response:  # fmt: skip
            raw = await response.read()
            if response.status >= 300:
                raise ApiError(response.status, response.reason or "", raw)
            return raw

    async def request(
        self, method: str, path: str, *, params: Params | None = None, body: Any = None,
        content_type: str = JSON, accept: str = JSON, timeout: float | None = None,
    ) -> Any:  # fmt: skip
        """The parsed JSON answer (None for an empty one)."""
        raw = await self.read(
            method, path, params=params, body=body, content_type=content_type, accept=accept, timeout=timeout
        )
        return json.loads(raw) if raw else None

    async def watch(
        self, path: str, params: Params | None = None, *,
        answer: float | None = None, idle: float | None = None,
    ) -> AsyncIterator[dict[str, Any]]:  # fmt: skip
        """The watch events of a collection (`{"type", "object"}` dicts, ERROR ones included), until
        the API server ends the watch; it is bounded by `timeoutSeconds` (plus 30 s) when given.
        `answer`: seconds the API server has to answer the request (else `TimeoutError`); `idle`:
        seconds the stream may bring nothing, not even a bookmark, before `WatchIdle`."""
        wanted = query(params) | {"watch": "true"}
        seconds = wanted.get("timeoutSeconds")
        async with asyncio.timeout(answer):
            response = await self._session.get(
                self.server + path, params=wanted, headers=self._headers(JSON, None),
                timeout=aiohttp.ClientTimeout(total=int(seconds) + 30 if seconds else None),
            )  # fmt: skip
        async with response:
            if response.status >= 300:
                raise ApiError(response.status, response.reason or "", await response.read())
            pending: list[bytes] = []
            chunks = response.content.iter_any()
            while True:
                quiet = asyncio.timeout(idle)
                try:
                    async with quiet:
                        chunk = await anext(chunks)
                except StopAsyncIteration:
                    return
                except TimeoutError as e:
                    if quiet.expired():
                        raise WatchIdle(f"nothing for {idle:g} s, not even a bookmark") from e
                    raise
                for line in lines(pending, chunk):
                    if line.strip():
                        yield json.loads(line)


def endpoint(kubeconfig: str | None = None) -> Endpoint:
    """The given kubeconfig file, else in-cluster, else $KUBECONFIG (its first file) or ~/.kube/config."""
    found = None if kubeconfig else endpoint_in_cluster(os.environ)
    if found is not None:
        return found
    file = Path(kubeconfig or (os.environ.get("KUBECONFIG") or "~/.kube/config").split(os.pathsep)[0])
    file = file.expanduser()
    return endpoint_of_kubeconfig(yaml.safe_load(file.read_text()), file.parent)


async def connect(kubeconfig: str | None = None) -> Kube:
    """A client for `endpoint(kubeconfig)`."""
    return Kube(endpoint(kubeconfig))


# ------------------------------------------------------------------------------ Scans and the CRD
async def list_scans(kube: Kube, namespace: str, page_size: int = 500) -> AsyncIterator[list[dict[str, Any]]]:
    """The Scans of a namespace, a page at a time (so no reader holds them all at once)."""
    token: str | None = None
    while True:
        page = await kube.request("GET", scan_path(namespace), params={"limit": page_size, "continue": token})
        yield page.get("items") or []
        token = (page.get("metadata") or {}).get("continue")
        if not token:
            return


def is_established(crd: dict[str, Any]) -> bool:
    conditions = (crd.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Established" and c.get("status") == "True" for c in conditions)


async def apply_crd(kube: Kube, body: dict[str, Any], timeout: float = 60.0) -> None:
    """Create or replace a CRD and wait until the API server serves it."""
    crds = path("apiextensions.k8s.io/v1", "customresourcedefinitions")
    name = body["metadata"]["name"]
    try:
        await kube.request("POST", crds, body=body)
    except ApiError as e:
        if e.status != 409:
            raise
        current = await kube.request("GET", f"{crds}/{name}")
        version = current["metadata"]["resourceVersion"]
        await kube.request(
            "PUT",
            f"{crds}/{name}",
            body={**body, "metadata": {**body["metadata"], "resourceVersion": version}},
        )
    deadline = time.monotonic() + timeout
    while not is_established(await kube.request("GET", f"{crds}/{name}")):
        if time.monotonic() > deadline:
            raise TimeoutError(f"CRD {name} not Established after {timeout}s")
        await asyncio.sleep(0.2)
