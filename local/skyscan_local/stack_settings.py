"""The local stack's settings: how `up` runs (`LocalStackSettings`, from the environment), the files it
keeps in its directory, and each component's local configuration (`LOCAL_DEFAULTS`), which any
variable already set in the environment overrides."""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from skyscan_local import postgres

REPO = Path(__file__).resolve().parents[2]
STATE_FILE, ENV_FILE, TOKEN_FILE, PRESIGN_KEY_FILE = "stack.json", "env", "tokens.json", "presign.key"
UI_LOGIN_FILE = "ui-login.json"  # the dashboard's one-time login codes (the shim's SKYSCAN_UI_LOGIN_FILE)
LOCK_FILE = "stack.lock"
ENV_KEYS = (
    "SKYSCAN_URL", "SKYSCAN_USER_TOKEN", "SKYSCAN_SYSTEM_TOKEN", "SKYSCAN_REFERENCE_TOKEN",
    "SKYSCAN_VIEWER_TOKEN", "SKYSCAN_WMS_URL", "KUBECONFIG", "SKYSCAN_NAMESPACE", "SKYSCAN_ARCHIVE_DSN",
    "SKYSCAN_OPERATOR_METRICS_URL",
)  # fmt: skip
ARCHIVE_DATABASE = postgres.APP_DATABASE

# The local clusters and tag catalog, which the shim and the operator both hold scans to, and where
# webhooks may go.
CATALOG = {
    "SKYSCAN_KNOWN_CLUSTERS": json.dumps({"osg": 100, "sub-2": 100, "local": 5}),
    "SKYSCAN_TAGS": json.dumps(["3.4.0", "4.0.0", "4.1.2", "4.2.0", "dev-branch-abc1234"]),
    "SKYSCAN_MIN_TAG": "4.0.0",
    # Webhook receivers beside the stack (the shim checks them, the operator delivers to them).
    "SKYSCAN_WEBHOOK_ALLOWED_HOSTS": json.dumps(["127.0.0.1", "localhost"]),
    "SKYSCAN_WEBHOOK_ALLOWED_NETWORKS": json.dumps(["127.0.0.0/8"]),
    "SKYSCAN_WEBHOOK_PLAIN_HTTP": "true",
}
# The local configuration of each component (short timers, the catalog above).
# A variable already set in the environment wins over these.
LOCAL_DEFAULTS: dict[str, dict[str, str]] = {
    "wms-simulator": {
        "SKYSCAN_WMS_SIM_ACTIVATION_DELAY": "1",
        "SKYSCAN_WMS_SIM_STEP_DELAY": "1",
        "SKYSCAN_WMS_SIM_RUN_INIT_COMMAND": "true",  # workers fetch startup.json before they start
    },
    "shim": {
        **CATALOG,
        "SKYSCAN_HOST": "127.0.0.1",
        "SKYSCAN_SHUTDOWN_DELAY_SECONDS": "0",  # no Service routes to a host process: `make down` at once
    },
    "operator": {
        **CATALOG,
        "SKYSCAN_BACKLOG_TICK_SECONDS": "1",
        "SKYSCAN_LOW_PRIORITY_INTERVAL_SECONDS": "2",
        "SKYSCAN_START_RETRY_DELAY_SECONDS": "5",
        "SKYSCAN_START_TIMEOUT_SECONDS": "60",
        "SKYSCAN_TEARDOWN_DELAY_SECONDS": "3",
        "SKYSCAN_WMS_POLL_INTERVAL_SECONDS": "1",
        "SKYSCAN_WMS_TIMEOUT_SECONDS": "5",
        "SKYSCAN_QUEUE_POLL_SECONDS": "0.5",
        # The WMS simulator knows the real WMS's clusters only (osg): the reference's retired `sub-2` is
        # asked as osg, as EWMS aliases it, and its local `local` too, so local requests keep working.
        "SKYSCAN_WMS_CLUSTERS_ALIAS": json.dumps({"sub-2": "osg", "local": "osg"}),
        "SKYSCAN_SCANNER_EPHEMERAL_STORAGE": "",  # the kwok node advertises no ephemeral storage
        # One operator, restarted by hand or by tests, not by a kubelet: under a name of its own it takes
        # its Lease back at once, and an API-server outage shorter than 28 s does not end it.
        "SKYSCAN_LEASE_IDENTITY": "local-operator",
        "SKYSCAN_LEASE_DURATION_SECONDS": "30",
        "SKYSCAN_LOG_LEVEL": "INFO",
    },
    "scanner-simulator": {},
}


class LocalStackSettings(BaseSettings):
    """How `up` runs, from the environment variables named by the aliases (only those: a plain
    KUBECONFIG or NAMESPACE in the environment must not count)."""

    model_config = SettingsConfigDict(extra="ignore", env_prefix="SKYSCAN_LOCAL_")

    dir: Path = Field(
        default=REPO / ".skyscan",
        validation_alias="SKYSCAN_LOCAL_DIR",
        description="State, logs, tokens and the env file.",
    )
    kubeconfig: str | None = Field(
        default=None,
        validation_alias="SKYSCAN_KUBECONFIG",
        description="Use this cluster instead of starting the local control plane.",
    )
    namespace: str = Field(
        default="skyscan",
        validation_alias="SKYSCAN_NAMESPACE",
        description="Namespace of the Scans (created if missing).",
    )
    archive_dsn: str | None = Field(
        default=None,
        validation_alias="SKYSCAN_LOCAL_ARCHIVE_DSN",
        description="Use this PostgreSQL database as the archive instead of starting a local server.",
    )
    postgres_port: int = Field(
        default=55432,
        validation_alias="SKYSCAN_LOCAL_POSTGRES_PORT",
        description="Preferred port of the local PostgreSQL (after the one it had; a free one when taken).",
    )
    simulate_scanner: bool = Field(
        default=False,
        validation_alias="SIMULATE_SCANNER",
        description="Hold scanner Pods and play the scanner server for them.",
    )
    shim_port: int = Field(
        default=8080,
        validation_alias="SKYSCAN_LOCAL_SHIM_PORT",
        description="Preferred shim port (after the one it had; a free one when taken; 0: none).",
    )
    wms_port: int = Field(
        default=8081,
        validation_alias="SKYSCAN_LOCAL_WMS_PORT",
        description="Preferred WMS simulator port (as above).",
    )
    ready_timeout: float = Field(
        default=120.0,
        validation_alias="SKYSCAN_LOCAL_READY_TIMEOUT",
        description="Seconds each component has to become ready.",
    )
    tie_to_parent: bool = Field(
        default=False, description="Tests: processes die with the process that started them."
    )
    overrides: dict[str, str] = Field(
        default_factory=dict, description="Tests: settings that win over the environment too."
    )
    component_overrides: dict[str, dict[str, str]] = Field(
        default_factory=dict, description="Tests: as `overrides`, for one component (by name)."
    )

    def overrides_for(self, component: str) -> dict[str, str]:
        return {**self.overrides, **self.component_overrides.get(component, {})}

    @property
    def cluster_dir(self) -> Path:
        return self.dir / "cluster"

    @property
    def postgres_dir(self) -> Path:
        return self.dir / "postgres"
