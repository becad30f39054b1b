"""The payload janitor (pure): ownerless payloads past the grace period are deleted, or adopted by
the Scans naming them; owned, young or dying ones are left alone; a sweep is bounded."""

from __future__ import annotations

from typing import Any

from skyscan import conditions as cond
from skyscan_operator.janitor import Adopt, Delete, referenced, sweep

NOW = 1_800_000_000.0


def payload(name: str, age: float, owners: list[dict[str, Any]] | None = None, **meta: Any) -> dict[str, Any]:
    return {"name": name, "resourceVersion": f"rv-{name}", "creationTimestamp": cond.iso(NOW - age),
            "ownerReferences": owners, **meta}  # fmt: skip


def scan(name: str, event: str, namespace: str = "ns") -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}"},
            "spec": {"sensorEventId": event}}  # fmt: skip


def test_scans_name_their_event_result_and_startup_file() -> None:
    refs = referenced([scan("s1", "e1"), scan("s2", "e1"), scan("s3", "e1", namespace="other")])
    assert [o["uid"] for o in refs[("ns", "skyscan-event-e1")]] == ["uid-s1", "uid-s2"]
    assert [o["uid"] for o in refs[("other", "skyscan-event-e1")]] == ["uid-s3"]
    assert ("ns", "skyscan-result-s1") in refs and ("ns", "skyscan-startup-s2") in refs
    (owner,) = refs[("ns", "skyscan-result-s1")]
    assert owner["kind"] == "Scan" and not owner.get("controller")  # payloads have no controller


def test_ownerless_payloads_past_the_grace_period_go_or_are_adopted() -> None:
    refs = referenced([scan("s1", "used")])
    listed = [
        payload("skyscan-event-debris", age=400),
        payload("skyscan-event-used", age=400),  # a kubectl-made event a Scan uses
        payload("skyscan-event-young", age=10),  # maybe a launch in progress elsewhere
        payload("skyscan-event-owned", age=400, owners=[{"uid": "u"}]),
        payload("skyscan-result-gone", age=400, deletionTimestamp=cond.iso(NOW)),
    ]
    changes = sweep("ns", listed, refs, now=NOW, grace=300, budget=10)
    assert changes == [
        Delete("skyscan-event-debris", "rv-skyscan-event-debris"),
        Adopt("skyscan-event-used", "rv-skyscan-event-used", tuple(refs[("ns", "skyscan-event-used")])),
    ]
    assert sweep("other", listed[:2], refs, now=NOW, grace=300, budget=10) == [
        Delete("skyscan-event-debris", "rv-skyscan-event-debris"),
        Delete("skyscan-event-used", "rv-skyscan-event-used"),  # no Scan names it in that namespace
    ]


def test_a_sweep_is_bounded() -> None:
    listed = [payload(f"skyscan-event-{i}", age=400) for i in range(10)]
    assert len(sweep("ns", listed, {}, now=NOW, grace=300, budget=3)) == 3
    assert sweep("ns", listed, {}, now=NOW, grace=300, budget=0) == []
