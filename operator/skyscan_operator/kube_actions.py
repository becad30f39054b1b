"""The actions on Kubernetes objects: the finalizer, the scanner's Job and its credential, the sensor
event's owners, the replacement scan. Each is idempotent: deterministic names, objects of the start
server-side applied once their owner is checked (`apply_owned`), a 404 on a delete taken as done.
"""

from __future__ import annotations

import contextlib
from typing import Any

from skyscan import conditions as cond
from skyscan import model, names
from skyscan.io import kube, payloads
from skyscan.io.kube import core_path, scan_path
from skyscan.io.kube_errors import Conflict, KubeError, NotFound, Refused
from skyscan_operator import scanner_job
from skyscan_operator.actions import (
    CheckEvent,
    CreateJob,
    DeleteJob,
    IssueScannerCredential,
    Replace,
    RevokeScannerCredential,
    SetFinalizer,
)
from skyscan_operator.execution import KUBE_ERRORS, Execution, Handler, Stop

MERGE = kube.MERGE_PATCH
JSON_PATCH = "application/json-patch+json"


async def apply_owned(run: Execution, body: dict[str, Any]) -> dict[str, Any]:
    """Server-side apply an object of the scan's start (a Secret or the Job; created if absent),
    unless it exists and is someone else's. The operator may not read Secrets: ownership is a JSON
    patch `test` that changes nothing, and fails unless the owner is this scan (404: absent)."""
    kind, name = body["kind"], body["metadata"]["name"]
    where = kube.path(body["apiVersion"], f"{kind.lower()}s", run.scan.namespace, name)
    probe = [{"op": "test", "path": "/metadata/ownerReferences/0/uid", "value": run.scan.uid}]
    try:
        await run.api.request("PATCH", where, body=probe, content_type=JSON_PATCH)
    except NotFound:
        pass  # absent: the apply creates it
    except KUBE_ERRORS as e:
        if isinstance(e, KubeError) and e.status == 422:  # the test failed: another owner
            await run.refuse(f"{kind} {name} exists and belongs to someone else")
        await run.kube_refused(e, f"looking at {kind} {name}")
    async with run.kube_call(f"applying {kind} {name}"):
        applied: dict[str, Any] = await run.api.apply(where, body, names.OPERATOR_MANAGER)
    return applied


async def set_finalizer(run: Execution, action: SetFinalizer) -> None:
    finalizer = names.WORKFLOW_FINALIZER
    current = list((run.body["metadata"].get("finalizers")) or [])
    wanted = [*current, finalizer] if action.present and finalizer not in current else current
    if not action.present:
        wanted = [f for f in current if f != finalizer]
    if wanted == current:
        return
    patch = {"metadata": {"finalizers": wanted, "resourceVersion": run.body["metadata"]["resourceVersion"]}}
    path = scan_path(run.scan.namespace, run.scan.name)
    try:
        new = await run.api.request("PATCH", path, body=patch, content_type=MERGE)
    except NotFound as e:
        raise Stop() from e
    except Conflict as e:
        raise Stop(0.5) from e  # changed meanwhile: plan again
    run.took(new)


async def create_job(run: Execution, action: CreateJob) -> float:
    # The credential the Job's Pod will present is on record first: an operator that died right
    # after creating the Job would otherwise leave a scanner the shim refuses as revoked.
    await run.flush()
    created = await apply_owned(run, action.job)
    name = action.job["metadata"]["name"]
    created_at = cond.epoch(created["metadata"].get("creationTimestamp"))
    run.draft.job = model.JobStatus(
        name=name,
        created_at=cond.iso(created_at or run.now()),
        state="Pending",
        reason="Pending",
    )
    run.draft.backlog = None
    run.condition(cond.ADMITTED, True, "Started", f"Job {name} created")
    run.event("JobCreated", f"created Job {name}")
    return 0.0


async def delete_job(run: Execution, action: DeleteJob) -> None:
    path = kube.path("batch/v1", "jobs", run.scan.namespace, action.name)
    try:
        await run.api.request("DELETE", path, params={"propagationPolicy": "Background"})
    except NotFound:
        return
    run.event("JobDeleted", f"deleted Job {action.name}")


async def issue_credential(run: Execution, action: IssueScannerCredential) -> None:
    """A token for the scanner ServiceAccount, bound to a new per-scan Secret and stored in it.
    Idempotent: an existing Secret of this scan is reused (its token is replaced)."""
    s = run.scan
    secret = await apply_owned(run, scanner_job.credential_secret(s.name, s.uid, s.namespace))
    name = secret["metadata"]["name"]
    request = scanner_job.token_request(name, secret["metadata"]["uid"], action.lifetime_seconds)
    account = run.settings.scanner_service_account
    async with run.kube_call(f"issuing a token for ServiceAccount {account}"):
        granted = await run.api.request(
            "POST", core_path("serviceaccounts", s.namespace, account, "token"), body=request
        )
        token = granted["status"]["token"]  # raw: TokenRequest
        await run.api.apply(
            core_path("secrets", s.namespace, name),
            scanner_job.credential_secret(s.name, s.uid, s.namespace, token),
            names.OPERATOR_MANAGER,
        )
    expires = cond.epoch(granted["status"].get("expirationTimestamp"))  # raw: TokenRequest
    run.draft.credential = model.ScannerCredential(secret=name, expires_at=expires)
    run.event("ScannerCredentialIssued", f"the scanner's own token, bound to Secret {name}")


async def revoke_credential(run: Execution, action: RevokeScannerCredential) -> None:
    with contextlib.suppress(NotFound):
        await run.api.request("DELETE", core_path("secrets", run.scan.namespace, action.secret))
    if run.draft.credential:
        run.draft.credential.revoked = True
    run.event("ScannerCredentialRevoked", f"deleted Secret {action.secret}: the scanner's token is void")


async def check_event(run: Execution, action: CheckEvent) -> float:
    """Look (metadata only) whether the scan's sensor event is stored; if the scan is not one of
    its owners, become one, so the event lives as long as the scan: the last step of a launch for
    an event stored for this scan (`skyscan.io/stored-for`), else worth telling (a kubectl-made
    event, or a reuse cut short before its owner patch). The answer goes to the store for the
    next plan."""
    s, event_id = run.scan, action.sensor_event_id
    meta = await payloads.event_metadata(run.api, s.namespace, event_id)
    if meta is not None and s.uid not in {o.get("uid") for o in meta.get("ownerReferences") or []}:
        try:
            await payloads.add_event_owner(run.api, s.namespace, event_id, run.body)
            if (meta.get("annotations") or {}).get(names.STORED_FOR_ANNOTATION) != s.name:
                run.event("EventAdopted", f"now an owner of its sensor event {event_id}")
        except NotFound:
            meta = None  # deleted meanwhile
    run.store.saw_event(s.namespace, s.name, meta is not None, run.now())
    return 0.0


async def replace(run: Execution, action: Replace) -> None:
    s, new_id = run.scan, action.new_id
    known = run.store.scan((s.namespace, new_id)) is not None
    created = await run.api.apply(scan_path(s.namespace, new_id), action.body, names.OPERATOR_MANAGER)
    if not known:
        run.event("ReplacementCreated", f"created replacement scan {new_id}")
    try:  # the shared sensor event must outlive the original scan
        await payloads.add_event_owner(run.api, s.namespace, s.spec.sensor_event_id, created)
    except NotFound:
        pass  # no stored event (a Scan made with kubectl): nothing to keep alive
    except Refused as e:
        if e.status != 403:
            raise
        # The replacement still runs; only its event's lifetime is at risk.
        run.event("EventOwnerNotAdded", f"cannot add {new_id} as an owner of the sensor event", True)
    if s.spec.replaced_by == new_id and s.spec.deleted:
        return
    # The one spec write the operator makes: exactly these two fields, as a merge patch.
    new = await run.api.request(
        "PATCH", scan_path(s.namespace, s.name), body={"spec": {"deleted": True, "replacedBy": new_id}},
        content_type=MERGE,
    )  # fmt: skip
    run.took(new)


KUBE_ACTIONS: dict[type, Handler] = {
    SetFinalizer: set_finalizer,
    CreateJob: create_job,
    DeleteJob: delete_job,
    IssueScannerCredential: issue_credential,
    RevokeScannerCredential: revoke_credential,
    CheckEvent: check_event,
    Replace: replace,
}
