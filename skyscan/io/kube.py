"""A thin async client for the Kubernetes API server, on aiohttp: JSON in, JSON (or raw bytes) out.

Everything we ask of the API server is a handful of REST calls on plain dicts; a generated client
costs the operator ~36 MiB and the shim ~0.35 s of import for nothing we use. `Kube` holds one
aiohttp session (no `trust_env`: the API server is reached directly, and netrc/proxy lookups would
hop to a thread on every call), authenticated as `skyscan.io.kubeconfig` says (a kubeconfig's context,
or in-cluster the pod's service account). A non-2xx answer raises the case of
`skyscan.io.kube_errors.KubeError` for its status.

    async with await connect(kubeconfig) as kube:
        scan = await kube.request("GET", scan_path("ns", "s-1"))
        await kube.request("PATCH", scan_path("ns", "s-1", "status"), body=..., content_type=MERGE_PATCH)
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import AsyncGenerator, AsyncIterator, Iterator, Mapping
from contextlib import AsyncExitStack, asynccontextmanager
from types import TracebackType
from typing import Any

import aiohttp

from skyscan import model
from skyscan.io.kube_errors import KubeError
from skyscan.io.kubeconfig import Credentials, Endpoint, endpoint

JSON = "application/json"
MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"
APPLY_PATCH = "application/apply-patch+yaml"  # server-side apply; a JSON body is valid YAML
# A watch event or a payload ConfigMap can carry an object up to etcd's request limit (1.5 MiB).
READ_BUFSIZE = 2**21

Params = Mapping[str, Any]  # str, int or bool values; None ones are left out


class WatchIdle(Exception):
    """A watch's stream brought nothing, not even a bookmark, for longer than the caller allows."""


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


# What the API server's YAML reader refuses raw or folds (C1 controls, NEL, the Unicode line and paragraph
# separators, non-characters): written as \u escapes instead. Surrogates it refuses even escaped.
YAML_UNSAFE = re.compile("[\x7f-\x9f\u2028\u2029\ufffe\uffff]")
SURROGATE = re.compile("[\ud800-\udfff]")


def as_yaml(body: Any) -> bytes:
    """A body for server-side apply (YAML, of which JSON is a subset), so that any text survives it:
    non-ASCII as UTF-8 rather than escaped (a character beyond the BMP would be a surrogate pair, which
    YAML refuses), what YAML cannot hold raw escaped, and a lone surrogate (JSON lets a client send
    one) as U+FFFD, as the API server's JSON reader makes it."""
    text = json.dumps(body, ensure_ascii=False)
    text = SURROGATE.sub("\ufffd", YAML_UNSAFE.sub(lambda m: f"\\u{ord(m.group()):04x}", text))
    return text.encode()


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


# ------------------------------------------------------------------------------ the client
class Kube:
    """One API server, one aiohttp session. Create it with `connect`; close it (or `async with`)."""

    def __init__(self, endpoint: Endpoint) -> None:
        self.server = endpoint.server
        self._credentials = Credentials(endpoint)
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(),  # TLS: each request's (the current certificate's)
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

    @asynccontextmanager
    async def _send(
        self, method: str, path: str, params: dict[str, str], data: bytes | None, accept: str,
        content_type: str | None, timeout: aiohttp.ClientTimeout,
    ) -> AsyncIterator[aiohttp.ClientResponse]:  # fmt: skip
        """The answer to a request with our current credential; one more try, with a fresh one, if the
        API server answers 401 and a fresh one may be had (see Credentials.renew)."""
        headers = {"Accept": accept} | ({"Content-Type": content_type} if content_type else {})
        for last in (False, True):
            credential = await self._credentials.current()
            token = {"Authorization": f"Bearer {credential.token}"} if credential.token else {}
            response = await self._session.request(
                method, self.server + path, params=params, data=data, headers=headers | token,
                timeout=timeout, ssl=self._credentials.ssl or False,
            )  # fmt: skip
            if response.status == 401 and not last and self._credentials.renew(credential):
                response.release()
                continue
            async with response:
                yield response
            return

    async def read(
        self, method: str, path: str, *, params: Params | None = None, body: Any = None,
        content_type: str = JSON, accept: str = JSON, timeout: float | None = None,
        idle: float | None = None,
    ) -> bytes:  # fmt: skip
        """The raw body of a 2xx answer (else the `KubeError` of its status); `body` is sent as JSON
        unless bytes. `timeout` bounds the whole call, `idle` each wait for the answer's next bytes (a
        long listing may take its time, a server that stopped answering may not)."""
        if body is None or isinstance(body, bytes):
            data = body
        else:
            data = as_yaml(body) if content_type == APPLY_PATCH else json.dumps(body).encode()
        async with self._send(
            method, path, query(params), data, accept, content_type if data is not None else None,
            aiohttp.ClientTimeout(total=timeout, sock_read=idle),
        ) as response:  # fmt: skip
            raw = await response.read()
            if response.status >= 300:
                raise KubeError(response.status, response.reason or "", raw)
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

    async def apply(
        self, path: str, body: dict[str, Any], field_manager: str, *, force: bool = True,
        timeout: float | None = None, parse: bool = True,
    ) -> Any:  # fmt: skip
        """Server-side apply `body` at `path` (the object's own path: created if absent) as
        `field_manager`, which then owns exactly the fields `body` sets: a field it set before and
        leaves out now is removed. `force` takes over fields another manager set to other values
        (each component is the one writer of its fields) instead of answering 409. The object as
        applied (None unless `parse`: a payload's answer echoes the payload)."""
        raw = await self.read(
            "PATCH", path, params={"fieldManager": field_manager, "force": force}, body=body,
            content_type=APPLY_PATCH, timeout=timeout,
        )  # fmt: skip
        return json.loads(raw) if parse and raw else None

    async def chunks(
        self, path: str, params: Params | None = None, *, answer: float | None = None,
        idle: float | None = None,
    ) -> AsyncGenerator[bytes]:  # fmt: skip
        """A GET's answer as it comes, a chunk at a time (a Pod's log, followed or not); no more of it
        is read than the caller has taken. `answer`: seconds the API server has to answer; `idle`:
        seconds each next chunk may take (else `TimeoutError`)."""
        async with AsyncExitStack() as stack:
            async with asyncio.timeout(answer):
                sending = self._send("GET", path, query(params), None, "*/*", None, aiohttp.ClientTimeout())
                response = await stack.enter_async_context(sending)
                if response.status >= 300:
                    raise KubeError(response.status, response.reason or "", await response.read())
            while True:
                async with asyncio.timeout(idle):
                    chunk = await response.content.readany()
                if not chunk:
                    return
                yield chunk

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
        total = aiohttp.ClientTimeout(total=int(seconds) + 30 if seconds else None)
        async with AsyncExitStack() as stack:
            async with asyncio.timeout(answer):
                sending = self._send("GET", path, wanted, None, JSON, None, total)
                response = await stack.enter_async_context(sending)
            if response.status >= 300:
                raise KubeError(response.status, response.reason or "", await response.read())
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
    conditions = (crd.get("status") or {}).get("conditions") or []  # raw: CRD
    return any(c.get("type") == "Established" and c.get("status") == "True" for c in conditions)  # raw: CRD


async def apply_crd(kube: Kube, body: dict[str, Any], field_manager: str, timeout: float = 60.0) -> None:
    """Create or update a CRD (server-side apply) and wait until the API server serves it."""
    crds = path("apiextensions.k8s.io/v1", "customresourcedefinitions")
    name = body["metadata"]["name"]
    await kube.apply(f"{crds}/{name}", body, field_manager)
    deadline = time.monotonic() + timeout
    while not is_established(await kube.request("GET", f"{crds}/{name}")):
        if time.monotonic() > deadline:
            raise TimeoutError(f"CRD {name} not Established after {timeout}s")
        await asyncio.sleep(0.2)
