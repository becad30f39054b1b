"""What a test (or `make up`) sets on the simulated WMS: its settings (`SKYSCAN_WMS_SIM_*`, the command
line, `PATCH /_sim/config`), the clusters it knows, and the faults and delays injected into its EWMS
routes (`/_sim/faults`, `/_sim/delays`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

REAL_CLUSTERS = {"osg": "grid-submitter.icecube.wisc.edu"}  # the WMS's config at 079f9e1
REAL_ALIASES = {"sub-2": "osg", "OSG": "osg"}
CI_CLUSTERS = {"test-alpha": "SCHEDD1", "test-beta": "SCHEDD2"}  # the real WMS's, with its CI flag only


class SimulatorSettings(BaseSettings):
    """Defaults for the command line, from `SKYSCAN_WMS_SIM_*`."""

    model_config = SettingsConfigDict(env_prefix="SKYSCAN_WMS_SIM_", extra="ignore")

    host: str = Field(default="127.0.0.1", description="Listen address.")
    port: int = Field(default=8081, description="Listen port; 0 picks a free one (printed on start).")
    activation_delay: float = Field(default=2.0, ge=0, description="Seconds until message queues activate.")
    step_delay: float = Field(
        default=1.0, ge=0, description="Seconds between taskforce phases (and the task manager's polls)."
    )
    page_size: int = Field(default=1000, ge=1, description="Objects per query page (next_after beyond).")
    ci_clusters: bool = Field(
        default=False,
        description="Also know the real WMS's CI-only clusters test-alpha and test-beta (besides osg, "
        "and its aliases sub-2 and OSG).",
    )
    pilot_tags: list[str] = Field(
        default=["1.0.5", "1.1.1", "1.1.2", "1.2.0"],
        description="The ewms-pilot X.Y.Z tags on the simulated CVMFS, which pilot_config.tag resolves to.",
    )
    require_auth: bool = Field(
        default=False,
        description="Require a bearer token minted by /oidc/token on the EWMS routes and the test hooks "
        "(/_sim/*), as EWMS does (`make up NODE=real`: true).",
    )
    client_id: str | None = Field(default=None, description="The one client /oidc/token serves; unset: any.")
    client_secret: str | None = Field(
        default=None, description="That client's secret, checked by /oidc/token; unset: not checked."
    )
    tms_client_id: str = Field(
        default="ewms-tms-simulator",
        description="The task manager's client (role system-tms) at /oidc/token.",
    )
    tms_client_secret: str | None = Field(
        default=None,
        description="Its secret; unset: a new random one per process (the embedded one knows it).",
    )
    task_manager: bool = Field(
        default=True, description="Run the simulated task manager in this process (off: taskforces wait)."
    )
    run_init_command: bool = Field(
        default=False,
        description="Workers fetch startup.json from the init command's URL before working (404 or "
        "unreachable: retried; other errors fail them, `FatalError`).",
    )
    init_retry_seconds: float = Field(
        default=1.0, gt=0, description="A fetch answered 404 (or unreachable) is retried after this long."
    )
    state_file: Path | None = Field(
        default=None,
        description="Keep the workflows in this JSON file (written on every change, read on start), so a "
        "restarted simulator remembers them as the real WMS does; unset: in memory only.",
    )

    def schedds(self) -> dict[str, str]:
        """Cluster location -> schedd, aliases included."""
        known = {**REAL_CLUSTERS, **(CI_CLUSTERS if self.ci_clusters else {})}
        return {**known, **{alias: known[name] for alias, name in REAL_ALIASES.items()}}


@dataclass
class Fault:
    status: int
    until: float
    count: int | None
    path_prefix: str
    method: str | None


@dataclass
class Delay:
    seconds: float
    when: str  # "before" the handler runs, or "after" it ran (the answer is late; the effect is not)
    count: int | None
    path_prefix: str
    method: str | None


Rule = TypeVar("Rule", Fault, Delay)


def take(rules: list[Rule], method: str, path: str, now: float) -> Rule | None:
    """The first rule in force for this request (a fault until its time is up), one of its uses spent."""
    for rule in rules:
        if getattr(rule, "until", now + 1) <= now or rule.count == 0:
            continue
        if path.startswith(rule.path_prefix) and rule.method in (None, method):
            if rule.count is not None:
                rule.count -= 1
            return rule
    return None
