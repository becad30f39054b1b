"""Benchmark: what token validation costs per request, shim GET /scan/{id}/manifest by bearer kind.

Stores N Scans (default 200) in a fresh namespace, starts a local OIDC issuer (discovery and JWKS for
an RSA key, on 127.0.0.1) and one `skyscan-shim serve` subprocess that trusts both a static token file
and that issuer, then measures, in the same run and interleaved round by round (so drift in the
machine's load hits every kind alike):

    (a) a static token (the token file: a sha256 and a dictionary lookup)
    (b) one OIDC JWT (RS256), verified on its first request and served from the verified-token cache
    (b') a new OIDC JWT for every request (a full signature check each time; for scale only)
    (c) a per-scan scanner token (TokenRequest, verified against the cluster's issuer), cached

and prints requests/s, p50/p99 and each kind's throughput relative to (a).

    python tools/bench/auth_bench.py [--scans 200] [--requests 3000] [--rounds 3] [--concurrency 16]

Uses SKYSCAN_TEST_KUBECONFIG when set, else starts the local control plane (SKYSCAN_K8S_BIN_READY as
for the tests) and stops it afterwards. Bounded: --deadline seconds (default 300) for the whole run.
The load generator runs on the same machine, so figures include its own CPU use.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import secrets
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import jwt
from aiohttp import web
from cryptography.hazmat.primitives.asymmetric import rsa
from jwt.algorithms import RSAAlgorithm

from skyscan.io import kube
from skyscan.io.kube import Kube, core_path, scan_path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness

from api_shim.auth import make_token
from skyscan import names
from skyscan.io import install, payloads
from skyscan_local import processes
from skyscan_operator import scanner_job

AUDIENCE = "skyscan"


@dataclass
class Kind:
    """One kind of bearer: where its tokens come from, the scans it may read, requests per round."""

    tokens: Callable[[], str]
    ids: list[str]
    per_round: int
    warmup: int = 100


class BenchIssuer:
    """A Keycloak-shaped issuer on 127.0.0.1: one RSA key, discovery and JWKS; counts its requests."""

    def __init__(self) -> None:
        self.key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self.kid = secrets.token_hex(8)
        self.port = processes.free_port()
        self.issuer = f"http://127.0.0.1:{self.port}/realms/bench"
        self.requests = 0

    @asynccontextmanager
    async def serving(self) -> AsyncIterator[None]:
        jwk = {**json.loads(RSAAlgorithm.to_jwk(self.key.public_key())), "kid": self.kid, "alg": "RS256"}

        async def discovery(_: web.Request) -> web.Response:
            self.requests += 1
            return web.json_response({"issuer": self.issuer, "jwks_uri": f"{self.issuer}/certs"})

        async def certs(_: web.Request) -> web.Response:
            self.requests += 1
            return web.json_response({"keys": [jwk]})

        app = web.Application()
        app.router.add_get("/realms/bench/.well-known/openid-configuration", discovery)
        app.router.add_get("/realms/bench/certs", certs)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", self.port).start()
        try:
            yield
        finally:
            await runner.cleanup()

    def config(self) -> list[dict[str, Any]]:
        return [{"issuer": self.issuer, "audience": AUDIENCE, "roles": {"user": ["skyscan-user"]}}]

    def token(self) -> str:
        now = int(time.time())
        claims = {
            "iss": self.issuer,
            "aud": [AUDIENCE, "account"],
            "sub": secrets.token_hex(8),
            "preferred_username": "bench",
            "iat": now,
            "exp": now + 3600,
            "realm_access": {"roles": ["skyscan-user"]},
        }
        return jwt.encode(claims, self.key, algorithm="RS256", headers={"kid": self.kid})


async def scanner_token(api: Kube, namespace: str, ids: list[str]) -> tuple[str, list[str]]:
    """(c) The token the operator hands scan `ids[0]`'s scanner (TokenRequest for the scanner account,
    bound to the scan's Secret), that scan's status saying its scanner runs; the one id it may read."""
    scan_id = ids[0]
    await install.ensure_scanner_account(api, namespace)
    secret = await api.request(
        "POST",
        core_path("secrets", namespace),
        body={"metadata": {"name": names.scanner_token_secret_name(scan_id)}},
    )
    status = {"job": {"name": names.job_name(scan_id), "state": "Running"},
              "scannerCredential": {"secret": secret["metadata"]["name"]}}  # fmt: skip
    await api.request(
        "PATCH",
        scan_path(namespace, scan_id, "status"),
        body={"status": status},
        content_type=kube.MERGE_PATCH,
    )
    scan = await api.request("GET", scan_path(namespace, scan_id))
    event = payloads.encode({"value": {"data": {"run_id": 1, "event_id": 2}}}, "event")
    await payloads.create_event(api, namespace, scan["spec"]["sensorEventId"], event, owners=[scan])
    request = scanner_job.token_request(secret["metadata"]["name"], secret["metadata"]["uid"], 3600)
    account = names.SCANNER_SERVICE_ACCOUNT
    granted = await api.request(
        "POST", core_path("serviceaccounts", namespace, account, "token"), body=request
    )
    return str(granted["status"]["token"]), [scan_id]


async def measure(
    get: Callable[[str, str], Awaitable[None]],
    tokens: Callable[[], str],
    ids: list[str],
    requests: int,
    concurrency: int,
    latencies: list[float],
) -> float:
    """GET the manifest of random `ids` `requests` times with bearer `tokens()`; append each latency;
    return the elapsed seconds."""

    async def one(_: int) -> None:
        await get(tokens(), random.choice(ids))

    elapsed, took = await harness.load_loop(one, requests, concurrency)
    latencies += took
    return elapsed


async def bench(kubeconfig: str, args: argparse.Namespace) -> dict[str, Any]:
    api = await kube.connect(kubeconfig)
    issuer = BenchIssuer()
    async with api, harness.namespace(api) as namespace:
        ids = await harness.create_scans(api, namespace, args.scans)
        with tempfile.TemporaryDirectory() as tmp:
            config = harness.ShimConfig.make(
                kubeconfig, namespace, Path(tmp), SKYSCAN_OIDC_ISSUERS=json.dumps(issuer.config())
            )
            system = make_token(config.token_file, "bench-system", ["system"])
            async with issuer.serving(), harness.running(harness.start_shim(config)) as shim:
                await shim.wait_ok()
                return await drive_all(api, namespace, shim.base, ids, (config.token, system), issuer, args)


async def drive_all(
    api: Kube,
    namespace: str,
    base: str,
    ids: list[str],
    statics: tuple[str, str],
    issuer: BenchIssuer,
    args: argparse.Namespace,
) -> dict[str, Any]:
    static, system = statics
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=args.concurrency)) as http:

        async def get(token: str, name: str) -> None:
            headers = {"Authorization": f"Bearer {token}"}
            async with http.get(f"{base}/scan/{name}/manifest", headers=headers) as r:
                assert r.status == 200, (r.status, await r.text())
                await r.read()

        oidc = issuer.token()
        rounds = args.rounds
        fresh = iter([issuer.token() for _ in range(args.requests // 2)])  # (b'): half as many
        kinds: dict[str, Kind] = {
            "(a) static token": Kind(lambda: static, ids, args.requests // rounds),
            "(b) OIDC JWT, cached after its first request": Kind(lambda: oidc, ids, args.requests // rounds),
            "(b') OIDC JWT, a new one per request": Kind(
                fresh.__next__, ids, args.requests // 2 // rounds, 0
            ),
        }
        # A system caller's manifest carries the scan's event, so (c) compares with a static system token.
        bearer, scan_ids = await scanner_token(api, namespace, ids)
        kinds["(a') static system token, its scan's manifest with the event"] = Kind(
            lambda: system, scan_ids, args.requests // rounds
        )
        kinds["(c) scanner token, cached after its first request"] = Kind(
            lambda: bearer, scan_ids, args.requests // rounds
        )
        for kind in kinds.values():  # warm up: connections, caches, the JWKS
            for _ in range(kind.warmup):
                await get(kind.tokens(), random.choice(kind.ids))
        latencies: dict[str, list[float]] = {name: [] for name in kinds}
        elapsed = dict.fromkeys(kinds, 0.0)
        stop_at = time.monotonic() + args.deadline
        for round_ in range(rounds):
            for name in list(kinds) if round_ % 2 == 0 else reversed(kinds):
                kind = kinds[name]
                elapsed[name] += await measure(
                    get, kind.tokens, kind.ids, kind.per_round, args.concurrency, latencies[name]
                )
            if time.monotonic() > stop_at:
                break
    results = {name: harness.stats(latencies[name], elapsed[name]).as_dict() for name in kinds}
    static_rps = results["(a) static token"]["per_s"]
    return {
        "scans_stored": len(ids),
        "requests_per_kind": {name: len(latencies[name]) for name in kinds},
        "concurrency": args.concurrency,
        "rounds": args.rounds,
        "shim GET /scan/{id}/manifest": results,
        "throughput relative to (a)": {
            kind: round(r["per_s"] / static_rps, 3) for kind, r in results.items()
        },
        "(c) relative to (a')": round(
            results["(c) scanner token, cached after its first request"]["per_s"]
            / results["(a') static system token, its scan's manifest with the event"]["per_s"],
            3,
        ),
        "issuer requests (discovery + JWKS)": issuer.requests,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scans", type=int, default=200)
    parser.add_argument("--requests", type=int, default=3000, help="per kind, over all rounds")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--deadline", type=float, default=300.0, help="seconds; no new round after it")
    args = parser.parse_args()
    load_before = os.getloadavg()
    result = asyncio.run(
        asyncio.wait_for(harness.on_control_plane(lambda kc: bench(kc, args)), args.deadline + 120)
    )
    result["load_average_before_after"] = [list(load_before), list(os.getloadavg())]
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
