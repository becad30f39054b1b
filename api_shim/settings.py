"""Shim configuration, parsed once from `SKYSCAN_*` environment variables.

Defaults mirror the reference service where it has one (sizes, clusters, minimum tag). Structured
values (`SKYSCAN_KNOWN_CLUSTERS`, `SKYSCAN_TAGS`) are JSON, as pydantic-settings reads them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, PrivateAttr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from api_shim.oidc import PeopleIssuerConfig
from api_shim.wire_names import Names
from skyscan import model, names, policy, presign
from skyscan.logs import LogFormat


class ShimSettings(BaseSettings, policy.PolicySettings):  # with the request policy's fields
    model_config = SettingsConfigDict(env_prefix="SKYSCAN_", extra="ignore")

    namespace: str = Field(default="skyscan", description="The one namespace holding every Scan.")
    kubeconfig: str | None = Field(default=None, description="Unset: in-cluster, else ~/.kube/config.")
    host: str = Field(default="0.0.0.0", description="Listen address.")
    port: int = Field(default=8080, description="Listen port.")
    tls_cert_file: Path | None = Field(
        default=None,
        description="Serve HTTPS with this PEM certificate (chain after it) and SKYSCAN_TLS_KEY_FILE; "
        "unset: plain HTTP (loopback, or behind a proxy that terminates TLS).",
    )
    tls_key_file: Path | None = Field(default=None, description="The private key of SKYSCAN_TLS_CERT_FILE.")
    log_format: LogFormat = Field(
        default="text", description="`json`: JSON lines (docs: Operating, Logs); `text`: plain lines."
    )
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field(
        default="INFO", description="The lowest level logged; `WARNING` leaves out the access log."
    )

    # Sizes when a request names none: bytes, or a size such as "2GB"; the Scan model's defaults.
    default_scanner_server_memory: str | int = Field(
        default=model.DEFAULT_SCANNER_SERVER_MEMORY_BYTES,
        description="Scanner-server memory when a request names none (bytes, or a size such as `1024M`).",
    )
    default_worker_memory: str | int = Field(
        default=model.DEFAULT_WORKER_MEMORY_BYTES, description="Worker memory when a request names none."
    )
    default_worker_disk: str | int = Field(
        default=model.DEFAULT_WORKER_DISK_BYTES, description="Worker disk when a request names none."
    )

    token_file: Path | None = Field(
        default=None,
        description="Local use: JSON {sha256 of token: {name, roles}}; see `skyscan-shim make-token`.",
    )
    auth_disabled: bool = Field(
        default=False, description="Local development only: every caller has the user and system roles."
    )
    oidc_issuers: list[PeopleIssuerConfig] = Field(
        default_factory=list,
        description="People's OIDC issuers (JSON list; docs: Security, People (OIDC)); empty: no OIDC.",
    )
    scanner_service_account: str = Field(
        default=names.SCANNER_SERVICE_ACCOUNT,
        description="The ServiceAccount whose per-scan tokens (audience skyscan-scanner) scanners present.",
    )
    scanner_names: Names = Field(
        default=Names.REFERENCE,
        description="The wire names answered to scanner credentials: `reference` for IceCube's skymap_scanner"
        " (it reads event_i3live_json_dict, ewms_deactivated...), `interface` for a scanner written to the"
        " interface's names (docs: REST API, Reference names).",
    )
    oidc_leeway_seconds: float = Field(
        default=30.0, description="Clock skew allowed on a JWT's `exp` and `nbf`, either way."
    )
    oidc_jwks_refetch_seconds: float = Field(
        default=30.0,
        description="At most one JWKS fetch per issuer per this interval (unknown `kid`s, failures).",
    )
    oidc_jwks_max_age_seconds: float = Field(
        default=600.0,
        description="A JWKS older than this is fetched again, so keys removed at the issuer stop verifying.",
    )
    oidc_token_cache_size: int = Field(
        default=10000,
        description="Verified JWTs kept until their `exp` (least recently used out), each checked once.",
    )
    logs_url_template: str | None = Field(
        default=None,
        description="Scanner-server logs URL; `{scan_id}` and `{namespace}` are filled in. Unset: this "
        "service's own `/scan/{scan_id}/logs/scanner-server` (a path) once the scanner's Pod exists, else "
        "null.",
    )
    max_log_streams: int = Field(
        default=100,
        ge=0,
        description="Scanner logs read live at once (`GET /scan/{id}/logs/scanner-server` while the "
        "scanner runs, each a stream from the API server); beyond, 503 `too many log streams`; kept logs "
        "are not counted.",
    )
    add_workers_timeout: float = Field(
        default=60.0, description="Seconds to wait for the operator to answer an add-workers request."
    )
    write_timeout: float = Field(default=10.0, description="Seconds per API-server write before 503.")
    shutdown_delay_seconds: float = Field(
        default=5.0,
        ge=0,
        le=60,
        description="On SIGTERM, keep serving this long before closing the port: a Pod being deleted "
        "still gets requests until every node's Service rules drop it (keep it under the Pod's "
        "terminationGracePeriodSeconds); the local stack's host processes use 0.",
    )
    watch_timeout: int = Field(default=300, description="Server-side timeout of one watch request.")
    cache_broken_seconds: float = Field(
        default=30.0,
        gt=0,
        description="How long the Scan watch may be broken (a list or watch failed, or went unanswered for "
        "30 s; a quiet watch is not broken) before /healthz answers 503 and routes answer 503 instead of "
        "serving what the shim can no longer vouch for.",
    )
    max_body_bytes: int = Field(default=32 * 1024 * 1024, description="Largest accepted request body.")
    body_bytes_at_once: int = Field(
        default=64 * 1024 * 1024,
        gt=0,
        description="Request bodies handled at once, in bytes (each its Content-Length, a chunked one "
        "SKYSCAN_MAX_BODY_BYTES; one body always fits); others wait, unread.",
    )
    body_wait_seconds: float = Field(
        default=15.0,
        gt=0,
        description="How long a request waits for room for its body before 503 `too many request bodies` "
        "(`Retry-After: 5`).",
    )
    max_event_streams: int = Field(
        default=5000,
        ge=0,
        description="Open `GET /scan/{id}/events` streams at most (one socket and about 15 KiB of shim "
        "memory each); beyond, 503 `too many event streams` (clients poll `/status`); 0 refuses every "
        "stream.",
    )
    event_keepalive_seconds: float = Field(
        default=15.0,
        gt=0,
        description="Seconds between `: keepalive` comments on an idle event stream; a client that left is "
        "noticed at the latest then.",
    )
    archive_dsn: str | None = Field(
        default=None,
        description="PostgreSQL DSN of the archive of finished scans (the operator's): every route reads "
        "archived scans too (soft delete and rescan included; other writes answer 400 `scan is archived`). "
        "Unset: live scans only.",
    )
    presign_key_file: Path | None = Field(
        default=None,
        description="Key file of the workers' presigned startup.json URLs (the operator's); unset: every "
        "`GET /scan/{id}/startup.json` is 403.",
    )
    ui_login_file: Path | None = Field(
        default=None,
        description="The local stack's one-time dashboard login codes (`make up` writes it and prints a "
        "link): each code's SHA-256 with the token it opens and its expiry. Unset: no login links.",
    )
    ui_oidc_issuer: str | None = Field(
        default=None,
        description="The dashboard's login: people log in at this issuer, one of SKYSCAN_OIDC_ISSUERS' "
        "(the authorization-code flow with PKCE; docs: Operating, The dashboard). Unset: no login button.",
    )
    ui_oidc_client_id: str | None = Field(
        default=None,
        description="The dashboard's client at SKYSCAN_UI_OIDC_ISSUER: public (no secret), standard flow, "
        "PKCE S256, redirect URI `https://<shim>/ui/`.",
    )
    ui_oidc_scopes: str = Field(
        default="openid profile", description="The scopes the dashboard asks for (space-separated)."
    )
    _presign_key: bytes | None = PrivateAttr(default=None)

    @model_validator(mode="after")
    def _dashboard_issuer(self) -> ShimSettings:
        """The dashboard logs people in only where the shim verifies their tokens."""
        if self.ui_oidc_issuer is None:
            return self
        issuers = [i.issuer for i in self.oidc_issuers]
        if self.ui_oidc_issuer not in issuers:
            raise ValueError(
                f"SKYSCAN_UI_OIDC_ISSUER {self.ui_oidc_issuer!r} is not one of SKYSCAN_OIDC_ISSUERS' issuers "
                f"({', '.join(map(repr, issuers)) or 'none is configured'}): the shim would refuse its tokens"
            )
        if not self.ui_oidc_client_id:
            raise ValueError("SKYSCAN_UI_OIDC_ISSUER needs SKYSCAN_UI_OIDC_CLIENT_ID, the dashboard's client")
        return self

    def model_post_init(self, context: Any, /) -> None:
        """The key is read once, at start-up: a missing or short key file stops the shim right away."""
        if self.presign_key_file is not None:
            self._presign_key = presign.check_key(self.presign_key_file.read_bytes())

    @property
    def presign_key(self) -> bytes | None:
        return self._presign_key
