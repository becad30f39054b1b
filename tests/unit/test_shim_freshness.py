"""The pure parts of read-your-writes across replicas: which ids may be read from the API server, and
the token bucket bounding those reads."""

from __future__ import annotations

import time

import pytest

from api_shim.repository import freshness
from skyscan import model


def test_only_well_formed_scan_ids_carry_a_creation_time() -> None:
    scan_id = model.new_scan_id(1_700_000_000.123, "ab" * 16)
    assert freshness.created_at(scan_id) == pytest.approx(1_700_000_000.123)
    for other in (
        "",
        "nope",
        scan_id.upper(),
        scan_id + "0",
        scan_id[:-1],
        scan_id.replace("x", "y"),
        "../" + scan_id,
    ):
        assert freshness.created_at(other) is None, other


def test_the_bucket_allows_its_burst_then_its_rate(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [100.0]
    monkeypatch.setattr(time, "monotonic", lambda: clock[0])
    bucket = freshness.TokenBucket(rate=2.0, burst=3)
    assert [bucket.take() for _ in range(4)] == [True, True, True, False]
    clock[0] += 0.5  # one token back
    assert [bucket.take() for _ in range(2)] == [True, False]
    clock[0] += 60  # never more than the burst
    assert sum(bucket.take() for _ in range(10)) == 3
