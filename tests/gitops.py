"""What GitOps tools make of a Scan object: Argo CD's health (the shipped Lua check, run by Lua 5.1 as
Argo CD's gopher-lua is) and Flux's kstatus (its rules for a custom resource, read in Python)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lupa.lua51 as lua51

HEALTH_LUA = Path(__file__).resolve().parents[1] / "manifests" / "argocd" / "health.lua"


def argocd_health(obj: dict[str, Any]) -> tuple[str, str]:
    """(status, message) as Argo CD's health check of `obj` answers: the script runs with `obj` global."""
    lua = lua51.LuaRuntime(unpack_returned_tuples=True)
    lua.globals().obj = lua.table_from(obj, recursive=True)
    health = lua.execute(HEALTH_LUA.read_text())
    return str(health["status"]), str(health["message"] or "")


def kstatus(obj: dict[str, Any]) -> str:
    """kstatus's `Compute` for a kind it has no built-in rule for, as kustomize-controller's health
    checks use it: Terminating while deleted; InProgress while status.observedGeneration (when set)
    lags metadata.generation; then the first True Reconciling (InProgress) or Stalled (Failed)
    condition decides; else Ready: True is Current, False or Unknown InProgress; no verdict is Current."""
    meta, status = obj["metadata"], obj.get("status") or {}
    if meta.get("deletionTimestamp"):
        return "Terminating"
    observed = status.get("observedGeneration")
    if "generation" in meta and observed is not None and observed != meta["generation"]:
        return "InProgress"
    conditions = status.get("conditions") or []
    for c in conditions:
        if c["type"] == "Reconciling" and c["status"] == "True":
            return "InProgress"
        if c["type"] == "Stalled" and c["status"] == "True":
            return "Failed"
    for c in conditions:
        if c["type"] == "Ready" and c["status"] in ("True", "False", "Unknown"):
            return "Current" if c["status"] == "True" else "InProgress"
    return "Current"
