"""What the shim's cache holds per Scan: its compact form packed small, unpacked as a fresh copy."""

from __future__ import annotations

import copy
import pickle
from typing import Any

import pytest

from api_shim.repository.cache import ScanCache
from skyscan.packing import Packer
from skyscan.scan_record import compact
from tests.unit.test_shim_view import SCAN


def waiting_scan(i: int) -> dict[str, Any]:
    """A Scan as the API server returns it: three writers' managedFields, a waiting status."""
    obj = copy.deepcopy(SCAN)
    obj["metadata"].update(
        name=f"scan-{i:05d}",
        namespace="skyscan",
        uid=f"0000-{i:08d}",
        resourceVersion=str(100 + i),
        managedFields=[
            {"manager": m, "operation": "Update", "fieldsV1": {"f:status": {f"f:{k}": {} for k in "abcdef"}}}
            for m in ("skyscan-shim", "skyscan-operator", "kubectl")
        ],
    )
    obj["spec"]["classifiers"] = {"origin": "alert", "i": i}
    obj["status"] = {
        "backlog": {"enteredAt": 1700000000.0 + i, "attempts": 0},
        "conditions": [
            {
                "type": "Admitted",
                "status": "False",
                "reason": "Waiting",
                "lastTransitionTime": "2023-11-14T22:13:20Z",
            }
        ],
        "eventMetadata": {
            "runId": 130000,
            "eventId": i,
            "eventType": "t",
            "mjd": 60000.5,
            "isRealEvent": True,
        },
    }
    return obj


def test_packed_objects_unpack_as_fresh_equal_copies() -> None:
    packer = Packer()
    scans = [compact(waiting_scan(i)) for i in range(20)]
    packed = [packer.pack(s) for s in scans]
    assert [packer.unpack(p) for p in packed] == scans
    first = packer.unpack(packed[3])
    first["spec"]["priority"] = 99
    assert packer.unpack(packed[3]) == scans[3]  # a reader's change stays its own
    # The first object is the dictionary: the others shrink to what is their own.
    assert max(len(p) for p in packed[1:]) * 4 < min(len(pickle.dumps(s)) for s in scans)


def test_unpacking_before_any_packing_is_refused() -> None:
    with pytest.raises(ValueError):
        Packer().unpack(b"\x00")


async def test_the_cache_holds_the_compact_form_and_answers_copies() -> None:
    cache = ScanCache(None, "skyscan")  # type: ignore[arg-type]  # filled by hand: no API calls
    obj = waiting_scan(1)
    cache.observe(obj)
    held = cache.get("scan-00001")
    assert held == compact(obj) and "managedFields" not in held["metadata"]
    held["status"]["backlog"]["attempts"] = 5
    assert cache.get("scan-00001") == compact(obj)
    assert cache.backlog() == [compact(obj)] and list(cache) == [compact(obj)]
