"""The archive row of a scan, computed without a database."""

from __future__ import annotations

from skyscan import manifest
from skyscan.io.archive import SCAN_COLUMNS, columns
from skyscan.scan_record import ScanRecord
from tests.archived import record, scan_object


def test_the_row_carries_the_search_columns_and_the_scan_says_when_it_was_archived() -> None:
    scan = scan_object("ns", "s1", sensorEventId="ev", classifiers={"origin": "alert"}, rescanOf="s0")
    rec = record(scan, result={"r": 1}, archived_at=99.5)
    row = columns(rec)
    assert tuple(row) == SCAN_COLUMNS
    identity = ("scan_id", "namespace", "sensor_event_id", "rescan_of", "run_id", "event_id")
    assert [row[k] for k in identity] == ["s1", "ns", "ev", "s0", 123, 456]
    assert row["classifiers"] == {"origin": "alert", "rescan": True, "origin_scan_id": "s0"}
    assert row["created_at"] == rec.manifest["timestamp"]
    assert row["last_updated"] == rec.manifest["last_updated"]
    assert row["is_deleted"] is False and row["manifest"] == manifest.of(scan)
    assert row["result"] == rec.result and row["archived_at"] == 99.5
    assert ScanRecord(row["scan"]).archived_at == 99.5
    assert "managedFields" not in row["scan"]["metadata"]
    assert "archivedAt" not in rec.scan["status"], "the record itself is not changed"


def test_a_scan_without_event_metadata_or_rescan_has_null_columns() -> None:
    row = columns(record(scan_object(event=None, deleted=True)))
    assert (row["run_id"], row["event_id"], row["rescan_of"], row["result"]) == (None, None, None, None)
    assert row["is_deleted"] is True


def test_a_live_scan_is_not_archived() -> None:
    assert ScanRecord(scan_object()).archived_at is None
