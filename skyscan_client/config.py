"""Where the service is and who the caller is: arguments, else the environment, else `.skyscan/env`.

`make up` writes `.skyscan/env` as shell lines (`export SKYSCAN_URL='http://…'`); a shell that
sourced it has `SKYSCAN_USER_TOKEN` set, so that counts after `SKYSCAN_TOKEN`.
"""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass
from pathlib import Path

ENV_FILE = Path(".skyscan") / "env"
TOKEN_VARIABLES = ("SKYSCAN_TOKEN", "SKYSCAN_USER_TOKEN")


class ConfigError(Exception):
    """No base URL or no token could be found."""


@dataclass(frozen=True)
class Config:
    base_url: str
    token: str


def read_env_file(path: Path) -> dict[str, str]:
    """The `export NAME=value` lines of a shell-sourceable file (other lines are ignored)."""
    values: dict[str, str] = {}
    for line in path.read_text().splitlines():
        words = shlex.split(line, comments=True)
        if len(words) == 2 and words[0] == "export" and "=" in words[1]:
            name, _, value = words[1].partition("=")
            values[name] = value
    return values


def find_env_file(start: Path | None = None) -> Path | None:
    """`$SKYSCAN_LOCAL_DIR/env` when that is set, else the nearest `.skyscan/env` from `start` upwards."""
    if local_dir := os.environ.get("SKYSCAN_LOCAL_DIR"):
        candidate = Path(local_dir) / "env"
        return candidate if candidate.is_file() else None
    here = (start or Path.cwd()).resolve()
    for folder in (here, *here.parents):
        if (folder / ENV_FILE).is_file():
            return folder / ENV_FILE
    return None


def resolve(base_url: str | None = None, token: str | None = None, env_file: Path | None = None) -> Config:
    """The first of: the arguments, SKYSCAN_URL / SKYSCAN_TOKEN (or SKYSCAN_USER_TOKEN), the env file."""
    path = env_file or find_env_file()
    from_file = read_env_file(path) if path is not None and path.is_file() else {}

    def first(names: tuple[str, ...]) -> str | None:
        for source in (os.environ, from_file):
            for name in names:
                if source.get(name):
                    return source[name]
        return None

    url = base_url or first(("SKYSCAN_URL",))
    bearer = token or first(TOKEN_VARIABLES)
    if not url or not bearer:
        missing = " and ".join(n for n, v in (("SKYSCAN_URL", url), ("SKYSCAN_TOKEN", bearer)) if not v)
        where = f" (read {path})" if path else " (no .skyscan/env found: `make up` writes one)"
        raise ConfigError(f"no {missing}: pass it, set it in the environment{where}")
    return Config(url.rstrip("/"), bearer)
