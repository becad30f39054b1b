"""Operator configuration, parsed once from `SKYSCAN_*` environment variables.

Defaults are the reference service's where it has one (15 s backlog tick, 300 s low-priority
interval, 3 start attempts, 60 s teardown delay, the Job's deadlines). Structured values are JSON,
as pydantic-settings reads them (`SKYSCAN_SCANNER_POD_ANNOTATIONS='{"a": "b"}'`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from pydantic import Field, PrivateAttr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from skyscan import names, policy, presign
from skyscan.logs import LogFormat

# EWMS at 079f9e1 (wms/config.py): its one cluster, the schedd it submits to, and its alias of the
# reference's retired `sub-2` (asked by that name, EWMS answers with `osg`'s taskforces).
DEFAULT_WMS_CLUSTER_SCHEDDS = {"osg": "grid-submitter.icecube.wisc.edu"}
DEFAULT_WMS_CLUSTERS_ALIAS = {"sub-2": "osg"}


class OperatorSettings(BaseSettings, policy.PolicySettings):  # with the request policy's fields
    model_config = SettingsConfigDict(env_prefix="SKYSCAN_", extra="ignore")

    # --- where ---
    namespace: str = Field(
        default="skyscan", description="The namespace holding the Scans (shared with the shim)."
    )
    watch_namespaces: list[str] = Field(
        default_factory=list, description="Namespaces to watch (JSON list); empty: just `namespace`."
    )
    webhook_retry_seconds: float = Field(
        default=86_400.0,
        gt=0,
        description="How long a webhook event is tried (retries with delays doubling up to 5 min) before it "
        "is given up.",
    )
    webhook_timeout_seconds: float = Field(
        default=10.0, gt=0, le=300, description="How long one webhook delivery may take (connect to answer)."
    )
    webhook_rate_per_second: float = Field(
        default=20.0, gt=0, description="Deliveries per second to one subscription at most."
    )
    kubeconfig: str | None = Field(
        default=None, description="Unset: in-cluster, else $KUBECONFIG / ~/.kube/config."
    )
    liveness_endpoint: str | None = Field(
        default=None, description="kopf's liveness endpoint, e.g. http://0.0.0.0:8081/healthz; unset: none."
    )
    metrics_port: int = Field(
        default=9090, ge=0, le=65535, description="Port of the Prometheus metrics (`GET /metrics`); 0: none."
    )
    metrics_host: str = Field(
        default="0.0.0.0",  # in a cluster Prometheus scrapes the Pod's address
        description="Address the metrics listen on (a cluster's Prometheus scrapes the Pod's address); "
        "127.0.0.1 keeps them on the machine (`make up` sets it).",
    )
    # --- which replica acts (docs: Operating, Scale) ---
    lease_name: str = Field(
        default="skyscan-operator",
        description="The Lease (coordination.k8s.io/v1) its holder acts by; other replicas stand by.",
    )
    lease_namespace: str | None = Field(
        default=None, description="The Lease's namespace; unset: `namespace`."
    )
    lease_duration_seconds: int = Field(
        default=8,
        ge=2,
        description="A standby takes over a Lease not renewed for this long, timed on its own clock: a "
        "killed operator's work resumes within this, a renew interval and the start (about 10 s).",
    )
    lease_renew_seconds: float = Field(
        default=2.0,
        gt=0,
        description="The holder renews this often and stops (exit 3) once it has not renewed for the "
        "duration less this; a standby reads the Lease this often. At most half the duration.",
    )
    lease_identity: str | None = Field(
        default=None,
        description="This replica's name in the Lease (the manifests give the Pod's); unset: hostname-pid.",
    )
    workers: int = Field(
        default=4, ge=1, description="Scans reconciled concurrently (each scan one at a time)."
    )
    log_format: LogFormat = Field(
        default="text", description="`json`: JSON lines, kopf's own lines included (docs: Operating, Logs)."
    )

    # --- backlog ---
    backlog_tick_seconds: float = Field(default=15.0, gt=0, description="How often the backlog admits scans.")
    low_priority_interval_seconds: float = Field(
        default=300.0,
        gt=0,
        description="At most one scan below `min_priority_asap` starts per this interval.",
    )
    min_priority_asap: int = Field(
        default=100, description="Scans with at least this priority start on any tick."
    )
    admissions_per_tick: int = Field(
        default=1, ge=1, description="High-priority scans admitted per tick (the reference admits one)."
    )
    max_start_attempts: int = Field(default=3, ge=1, description="Start attempts before a scan is Failed.")
    start_retry_delay_seconds: float = Field(
        default=300.0, ge=0, description="A failed start attempt goes back to the backlog for this long."
    )
    start_timeout_seconds: float = Field(
        default=300.0,
        gt=0,
        description="An admitted scan without a Job after this long (while the WMS and the API server "
        "answer) counts as a failed attempt.",
    )
    outage_retry_delay_seconds: float = Field(
        default=15.0,
        ge=0,
        description="A start attempt interrupted by a WMS or API-server outage or a quota refusal is not "
        "counted; the scan waits this long, doubling with each interruption in a row, ...",
    )
    outage_retry_max_delay_seconds: float = Field(
        default=300.0,
        ge=0,
        description="... up to this long (the reference retries a quota refusal every 300 s).",
    )
    event_grace_seconds: float = Field(
        default=60.0,
        gt=0,
        description="A scan whose sensor event is not stored this long after its creation is Failed "
        "(EventMissing); until then it waits (the REST shim stores the event at the same time as the Scan).",
    )
    max_running_scanners: int = Field(
        default=0, ge=0, description="Cap on concurrently started, unfinished scans; 0 = no cap."
    )
    backlog_positions_shown: int = Field(
        default=20,
        ge=0,
        description="The first this many waiting scans in admission order show their position and "
        "estimated start in their status (`kubectl get scans`); GET /scans/backlog gives every position.",
    )
    backlog_positions_interval_seconds: float = Field(
        default=5.0,
        ge=0,
        description="Those positions are looked at again at most this often (on a backlog tick): a pass "
        "writes at most `backlog_positions_shown` statuses, plus those pushed back beyond them.",
    )
    backlog_rate_window_seconds: float = Field(
        default=600.0,
        gt=0,
        description="The estimated start is the position divided by the admission rate over this window.",
    )

    # --- ending ---
    teardown_delay_seconds: float = Field(
        default=60.0,
        ge=0,
        description="After a final result, wait this long before telling the WMS `finished`.",
    )
    image_pull_grace_seconds: float = Field(
        default=300.0,
        ge=0,
        description="A scanner Pod whose image cannot be pulled, or whose container the kubelet cannot "
        "create, this long after it was scheduled fails its scan (ImageUnavailable, ContainerConfigInvalid); "
        "an invalid image name fails it at once.",
    )
    replacement_max_scans: int = Field(
        default=3,
        ge=0,
        description="No automatic replacement once more than this many scans of one lineage ...",
    )
    replacement_window_seconds: float = Field(
        default=36000.0, gt=0, description="... were created within this window (the reference: 3 in 10 h)."
    )

    # --- payload janitor ---
    janitor_interval_seconds: float = Field(
        default=300.0,
        gt=0,
        description="How often payload ConfigMaps without an owner are looked for (a metadata-only list).",
    )
    payload_grace_seconds: float = Field(
        default=300.0,
        ge=0,
        description="A payload without an owner this old is deleted (or adopted by the Scans naming it).",
    )

    # --- archive ---
    archive_dsn: str | None = Field(
        default=None,
        description="PostgreSQL DSN of the archive (the shim's too); unset: finished scans stay.",
    )
    archive_retention_seconds: float = Field(
        default=604800.0,
        ge=0,
        description="A finished scan moves to the archive this long after it finished (default 7 days).",
    )
    archive_interval_seconds: float = Field(
        default=30.0, gt=0, description="How often scans due for the archive are moved."
    )
    archive_batch: int = Field(default=200, ge=1, description="At most this many scans moved per interval.")

    # --- WMS ---
    wms_address: str | None = Field(
        default=None, description="EWMS base URL (serves /v1 and /v1/mqs). Unset: no WMS; scans stay queued."
    )
    wms_oidc_issuer: str | None = Field(
        default=None, description="OIDC issuer for client-credentials auth; unset: no auth (local use)."
    )
    wms_client_id: str | None = Field(default=None, description="OIDC client id.")
    wms_client_secret: str | None = Field(default=None, description="OIDC client secret.")
    wms_timeout_seconds: float = Field(default=30.0, gt=0, description="Timeout of one WMS request.")
    wms_retries: int = Field(default=3, ge=0, description="Retries on connection errors and 5xx.")
    wms_backoff_seconds: float = Field(
        default=0.5, ge=0, description="First retry delay; doubles each retry."
    )
    wms_poll_interval_seconds: float = Field(
        default=30.0, gt=0, description="One batched WMS query for all active scans per this interval."
    )
    queue_poll_seconds: float = Field(
        default=10.0, gt=0, description="How often a starting scan checks its message queues are activated."
    )
    wms_clusters_alias: dict[str, str] = Field(
        default_factory=lambda: dict(DEFAULT_WMS_CLUSTERS_ALIAS),
        description="Cluster name rewrites before asking the WMS, at launch and add-workers alike (JSON "
        "object; the default is EWMS's own alias of the reference's retired name).",
    )
    wms_cluster_schedds: dict[str, str] = Field(
        default_factory=lambda: dict(DEFAULT_WMS_CLUSTER_SCHEDDS),
        description="WMS cluster location -> its HTCondor schedd, as the WMS's configuration pairs them "
        "(JSON object): EWMS's taskforces name only their schedd, and the status shows the cluster.",
    )
    task_image_prefix: str = Field(
        default="/cvmfs/icecube.opensciencegrid.org/containers/realtime/skymap_scanner:",
        description="The workers' apptainer image is this prefix + the scan's docker tag.",
    )
    startup_json_url: str = Field(
        default="{rest_address}/scan/{scan_id}/startup.json",
        description="Where workers fetch the scanner's startup.json; {rest_address}/{scan_id} are filled in.",
    )
    presign_key_file: Path | None = Field(
        default=None,
        description="Key file (a mounted Secret, the shim's too) signing that URL (`?expires=&signature=`, "
        "valid for the start timeout + the Job's deadline); unset: unsigned, the shim answers 403.",
    )
    max_worker_runtime_seconds: int = Field(
        default=86400, gt=0, description="WMS worker_config.max_worker_runtime."
    )
    pilot_timeout_queue_incoming: int | None = Field(
        default=None, description="EWMS_PILOT_TIMEOUT_QUEUE_INCOMING for workers (unset: WMS default)."
    )

    # --- scanner Job ---
    scanner_image: str = Field(
        default="icecube/skymap_scanner", description="Image repository; the tag is the scan's."
    )
    sidecar_image: str = Field(
        default="ghcr.io/skyscan/skyscan:0.1.0",
        description="Skyscan's own image, run as the scanner Pod's startup.json sidecar (`skyscan-sidecar`).",
    )
    rest_address: str = Field(
        default="http://skyscan-shim:8080",
        description="The REST address handed to the scanner server; https:// beyond loopback (the "
        "scanner's token crosses it).",
    )
    rest_ca_configmap: str | None = Field(
        default=None,
        description="ConfigMap (key ca.crt) of the CA of the shim's TLS certificate: mounted in scanner "
        "Pods, whose scanner and sidecar trust only it (SSL_CERT_FILE, REQUESTS_CA_BUNDLE).",
    )
    scanner_service_account: str = Field(
        default=names.SCANNER_SERVICE_ACCOUNT,
        description="ServiceAccount of scanner pods and of their per-scan tokens; give it no RBAC bindings.",
    )
    scanner_env: dict[str, str] = Field(
        default_factory=dict, description="Extra scanner env (JSON object); the user's env cannot replace it."
    )
    scanner_restricted: bool = Field(
        default=True,
        description="The scanner container runs as the restricted Pod Security profile asks: not as root "
        "(its image names a numeric non-root user; the local scanner image's is 10001), a read-only root "
        "filesystem (writable emptyDirs at /tmp and /common-space), no privilege escalation, no capabilities "
        "(the Pod always has the runtime's seccomp profile, the sidecar is always restricted). false: as its "
        "image says, for an image that needs root or writes elsewhere; otherwise its scans fail with "
        "ContainerConfigInvalid.",
    )
    scanner_ephemeral_storage: str | None = Field(
        default="8G", description="Ephemeral-storage request of the scanner (reference: 8G); empty: none."
    )
    job_active_deadline_seconds: int = Field(default=172800, gt=0, description="Job activeDeadlineSeconds.")
    job_ttl_seconds_after_finished: int = Field(default=600, ge=0, description="Job ttlSecondsAfterFinished.")
    scanner_log_end_bytes: int = Field(
        default=2**20,
        ge=0,
        le=8 * 2**20,
        description="Of an ended scanner container's log, the first and the last this many bytes each are "
        "kept with the scan, a marker line between them saying how many were cut; both halved until it fits "
        "in 1 MB compressed (docs: Logs, Scanner logs).",
    )
    scanner_log_read_seconds: float = Field(
        default=120.0,
        gt=0,
        description="How long reading one ended scanner's log may take before it is tried again (3 tries).",
    )
    scanner_pod_annotations: dict[str, str] = Field(
        default_factory=dict, description="Extra annotations on scanner pods (JSON object)."
    )
    argocd_app_name: str | None = Field(
        default=None, description="When set, Jobs get the Argo CD tracking-id annotation of this app."
    )

    _presign_key: bytes | None = PrivateAttr(default=None)

    def model_post_init(self, context: Any, /) -> None:
        """The presign key is read once, here: a missing or short key file stops the operator at start."""
        if self.presign_key_file is not None:
            self._presign_key = presign.check_key(self.presign_key_file.read_bytes())

    @model_validator(mode="after")
    def _renewals_fit(self) -> OperatorSettings:
        """A holder gets a second try at renewing before its deadline."""
        if 2 * self.lease_renew_seconds > self.lease_duration_seconds:
            raise ValueError("lease_renew_seconds must be at most half of lease_duration_seconds")
        return self

    @property
    def rest_in_clear(self) -> bool:
        """Scanners would send their bearer token unencrypted beyond this host."""
        parts = urlsplit(self.rest_address)
        return parts.scheme == "http" and parts.hostname not in ("127.0.0.1", "::1", "localhost")

    @property
    def presign_key(self) -> bytes | None:
        return self._presign_key

    @property
    def namespaces(self) -> list[str]:
        return self.watch_namespaces or [self.namespace]

    def wms_cluster(self, location: str) -> str:
        """The name the WMS is asked for a requested cluster location by (`wms_clusters_alias`)."""
        return self.wms_clusters_alias.get(location, location)

    @property
    def wms_base_url(self) -> str | None:
        return self.wms_address.rstrip("/") if self.wms_address else None
