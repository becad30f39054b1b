"""A real Keycloak for tests: the distribution tools/keycloak/install.sh caches, started with `kc.sh
start-dev` on a free loopback port from a directory of the test's own (its database and the realm it
imports there; the program's files linked from the cache), once it serves the realm's discovery document
(bounded), and stopped after."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from skyscan_local.processes import free_port

REPO = Path(__file__).resolve().parents[2]
INSTALL = REPO / "tools" / "keycloak" / "install.sh"
START_TIMEOUT = 420.0  # seconds; it took 55 s to 2.5 min on a 2-core machine under loads of 5 to 9


def installed() -> Path:
    """The cached Keycloak directory (fetched and built first if missing); RuntimeError saying why not."""
    done = subprocess.run(["bash", str(INSTALL)], capture_output=True, text=True, timeout=1200, check=False)
    if done.returncode != 0:
        raise RuntimeError(done.stderr.strip().splitlines()[-1] if done.stderr.strip() else "failed")
    return Path(done.stdout.strip().splitlines()[-1])


@dataclass(frozen=True)
class Keycloak:
    url: str  # http://127.0.0.1:<port>
    realm: str
    log: Path
    started_in: float  # seconds from the process's start to the discovery document

    @property
    def issuer(self) -> str:
        return f"{self.url}/realms/{self.realm}"


@contextmanager
def keycloak(home: Path, workdir: Path, realm: dict[str, Any]) -> Iterator[Keycloak]:
    """Keycloak at `home` serving `realm` (a realm representation, imported at start) from `workdir`."""
    for name in ("lib", "conf", "providers", "themes"):  # kc.home.dir is bin/..: this directory
        (workdir / name).symlink_to(home / name)
    shutil.copytree(home / "bin", workdir / "bin")
    (workdir / "data" / "import").mkdir(parents=True)
    (workdir / "data" / "import" / f"{realm['realm']}.json").write_text(json.dumps(realm))
    port, log = free_port(), workdir / "keycloak.log"
    env = {
        **os.environ,
        "JAVA_HOME": (home / "java-home").read_text().strip(),
        # Its thread pool resets thread locals through java.lang, which Java 25 keeps closed unless told
        # (else each of its threads fails at shutdown, loudly).
        "JAVA_OPTS_APPEND": "--add-opens=java.base/java.lang=ALL-UNNAMED",
    }
    command = [str(workdir / "bin" / "kc.sh"), "start-dev", "--import-realm", "--http-host", "127.0.0.1"]
    started = time.monotonic()
    with log.open("ab") as out:
        process = subprocess.Popen(  # a group of its own: kc.sh and the JVM it starts end together
            [*command, "--http-port", str(port)], env=env, stdout=out, stderr=out, start_new_session=True
        )
    server = Keycloak(f"http://127.0.0.1:{port}", realm["realm"], log, 0.0)
    try:
        with httpx.Client(timeout=5) as http:
            deadline = started + START_TIMEOUT
            while True:
                assert process.poll() is None, (
                    f"Keycloak exited {process.returncode}:\n{log.read_text()[-3000:]}"
                )
                try:
                    if http.get(f"{server.issuer}/.well-known/openid-configuration").status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                assert time.monotonic() < deadline, f"Keycloak not serving after {START_TIMEOUT} s: {log}"
                time.sleep(0.5)
        yield Keycloak(server.url, server.realm, log, time.monotonic() - started)
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(10)
