"""The scanner's kept log (head, marker, tail, how it ended; within its compressed size) and whose
Pod's log may be read (`skyscan.scanner_log`), and which Pod events say a scanner ended
(`log_keeper.ended`)."""

from __future__ import annotations

import gzip
import os
import random
import time
from unittest.mock import Mock

import pytest

from api_shim import view
from api_shim.errors import ApiError
from api_shim.handlers.scanner_log import LogStreams
from api_shim.settings import ShimSettings
from skyscan import names, scanner_log
from skyscan.scanner_log import HeadTail, compressed, ending, is_scanner_pod, marker
from skyscan_operator.log_keeper import LogKeeper, ended
from skyscan_operator.settings import OperatorSettings

SCAN = "0193aaaaaaax0123456789abcdef0123"


def fed(data: bytes, head: int, tail: int, sizes: list[int] | None = None) -> HeadTail:
    kept, at = HeadTail(head, tail), 0
    for size in sizes or [len(data)]:
        kept.feed(data[at : at + size])
        at += size
    kept.feed(data[at:])
    return kept


def test_a_log_within_the_room_is_kept_whole_without_a_marker() -> None:
    log = b"".join(f"line {i}\n".encode() for i in range(100))
    kept = fed(log, 1000, 1000)
    assert (kept.total, kept.cut) == (len(log), 0)
    assert kept.text() == log
    assert fed(log, len(log), 0).text() == log and fed(log, 0, len(log)).text() == log


def test_a_longer_log_keeps_its_head_and_tail_and_says_how_many_bytes_were_cut() -> None:
    log = b"".join(f"line {i}\n".encode() for i in range(100_000))
    kept = fed(log, 4096, 8192)
    assert kept.total == len(log) and kept.cut == len(log) - 4096 - 8192
    text = kept.text(b"[end]\n")
    head, rest = text[:4096], text[4096:]
    assert head == log[:4096]
    assert rest.startswith(b"\n" + marker(kept.cut)) or rest.startswith(marker(kept.cut))
    assert rest.endswith(log[-8192:] + b"[end]\n")
    assert f"[skyscan: {kept.cut} bytes of this log cut here]".encode() in text


@pytest.mark.parametrize("seed", range(5))
def test_chunks_of_any_size_keep_what_the_whole_log_does(seed: int) -> None:
    rng = random.Random(seed)
    log = os.urandom(rng.randrange(0, 50_000))
    head, tail = rng.randrange(0, 20_000), rng.randrange(0, 20_000)
    sizes = [rng.randrange(0, 5000) for _ in range(rng.randrange(1, 40))]
    whole, chunked = fed(log, head, tail), fed(log, head, tail, sizes)
    assert (chunked.head, chunked.tail, chunked.total) == (whole.head, whole.tail, whole.total)
    assert bytes(whole.head) == log[:head]
    assert bytes(whole.tail) == log[min(head, len(log)) :][-tail:] if tail else whole.tail == b""


def test_the_last_line_says_how_the_container_ended() -> None:
    line = ending({"reason": "OOMKilled", "exitCode": 137, "finishedAt": "2026-11-28T10:00:00Z"})
    assert (
        line == b"[skyscan: the scanner container ended: OOMKilled, exit code 137, at 2026-11-28T10:00:00Z]\n"
    )
    assert b"unknown reason, exit code None, at an unknown time" in ending({})


def test_an_unfinished_last_line_is_ended_before_the_marker_and_the_ending() -> None:
    kept = fed(b"x" * 10 + b"partial", 10, 3)
    assert kept.text(b"[end]\n") == b"x" * 10 + b"\n" + marker(4) + b"ial\n[end]\n"


def test_a_log_that_compresses_badly_is_cut_further_until_it_fits() -> None:
    log = os.urandom(300_000)
    kept = fed(log, 100_000, 100_000)
    data, fitted = compressed(kept, b"[end]\n", 60_000)
    assert len(data) <= 60_000
    text = gzip.decompress(data)
    assert (fitted.head_limit, fitted.tail_limit) == (25_000, 25_000)
    assert text.startswith(log[:25_000]) and text.endswith(log[-25_000:] + b"\n[end]\n")
    assert marker(300_000 - 50_000) in text and fitted.total == 300_000
    small, same = compressed(fed(b"hello\n", 10, 10), b"", 60_000)
    assert gzip.decompress(small) == b"hello\n" and same.head_limit == 10


def test_the_kept_log_is_gzip_of_its_text_at_level_6_with_no_time_in_it_and_just_fits() -> None:
    """The same log is the same bytes (no mtime), as payloads are compressed; a log that fits exactly
    is kept whole."""
    rng = random.Random(1)
    log = b"".join(
        b"%08d line %s\n" % (i, bytes(rng.choice(b"abcdefgh") for _ in range(rng.randrange(5, 40))))
        for i in range(20000)
    )
    kept = fed(log, 10**6, 10**6)
    expected = gzip.compress(log + b"[end]\n", compresslevel=6, mtime=0)
    assert expected != gzip.compress(log + b"[end]\n", compresslevel=7, mtime=0)
    data, same = compressed(kept, b"[end]\n", len(expected))
    assert data == expected and same is kept
    data, smaller = compressed(kept, b"[end]\n", len(expected) - 1)
    assert smaller.head_limit == 500_000 and len(data) < len(expected)


def test_a_tail_alone_is_cut_until_it_fits() -> None:
    log = os.urandom(20_000)
    data, fitted = compressed(fed(log, 0, 20_000), b"", 6_000)
    assert len(data) <= 6_000 and fitted.tail_limit == 5_000
    assert gzip.decompress(data) == marker(15_000) + log[-5_000:] + b"\n"


def test_every_part_ends_its_line_the_last_too() -> None:
    kept = fed(b"abc", 10, 10)
    assert kept.text(b"[end]") == b"abc\n[end]\n" and kept.text() == b"abc\n"
    assert fed(b"", 10, 10).text() == b""


def test_nothing_fits_nothing_is_kept_but_the_marker_and_ending() -> None:
    data, fitted = compressed(fed(os.urandom(5000), 1000, 1000), b"[end]\n", 40)
    assert (len(fitted.head), len(fitted.tail)) == (0, 0)
    assert gzip.decompress(data) == marker(5000) + b"[end]\n"


def test_only_names_the_job_controller_gives_the_scans_pods_are_its_scanner_pods() -> None:
    job = names.job_name(SCAN)
    assert is_scanner_pod(SCAN, f"{job}-bcd2f")
    assert is_scanner_pod(SCAN, f"{job}-zz999")
    for other in (
        f"{job}-bcd2",  # too short
        f"{job}-bcd2fg",  # too long
        f"{job}-abcde",  # `a` and `e` are no generated name's
        f"{job}-BCD2F",
        f"{job}bcd2f",
        f"x{job}-bcd2f",
        f"{names.job_name('0193aaaaaaax0123456789abcdef0124')}-bcd2f",  # another scan's
        f"{job}-x-bcd2f",  # scan `<id>-x`'s
        "kube-apiserver-node",
        "",
        f"{job}-bcd2f/../../other",
    ):
        assert not is_scanner_pod(SCAN, other), other


def test_a_long_scan_ids_pods_are_named_from_its_job_name_cut_to_58_characters() -> None:
    long_id = "a" * 80
    base = f"{names.job_name(long_id)}-"[:58]
    assert is_scanner_pod(long_id, base + "bcdfg")
    assert not is_scanner_pod(long_id, f"{names.job_name(long_id)}-bcdfg")
    assert not is_scanner_pod(long_id, base[:-1] + "bcdfg")


def test_the_logs_url_is_the_shims_route_once_a_scanner_pod_is_known() -> None:
    scan = {"metadata": {"name": SCAN}, "spec": {}, "status": {}}
    assert view.logs_url(scan, None, "ns") is None
    scan["status"] = {"job": {"name": names.job_name(SCAN), "pod": f"{names.job_name(SCAN)}-bcdfg"}}
    assert view.logs_url(scan, None, "ns") == f"/scan/{SCAN}/logs/scanner-server"
    assert view.logs_url(scan, "https://g/{namespace}/{scan_id}", "ns") == f"https://g/ns/{SCAN}"


def pod(statuses: list[dict[str, object]], labels: dict[str, str] | None = None) -> dict[str, object]:
    meta = {
        "name": "p",
        "namespace": "ns",
        "labels": {names.SCAN_ID_LABEL: SCAN} if labels is None else labels,
    }
    return {"metadata": meta, "status": {"containerStatuses": statuses}}


def test_a_pod_event_tells_when_its_scanner_container_ended() -> None:
    container = names.container_name(SCAN)
    done = {"reason": "OOMKilled", "exitCode": 137}
    found = ended(pod([{"name": container, "state": {"terminated": done}}]))
    assert found is not None
    assert (found.namespace, found.scan_id, found.pod, found.container) == ("ns", SCAN, "p", container)
    assert found.terminated == done
    assert ended(pod([{"name": container, "state": {"running": {}}}])) is None
    assert ended(pod([{"name": "sidecar", "state": {"terminated": done}}])) is None
    assert ended(pod([{"name": container, "state": {"terminated": done}}], labels={})) is None
    assert (
        ended({"metadata": {"name": "p", "namespace": "ns", "labels": {names.SCAN_ID_LABEL: SCAN}}}) is None
    )
    assert scanner_log.is_scanner_pod(SCAN, "p") is False


def test_live_reads_are_capped_and_refused_once_the_shim_stops() -> None:
    streams = LogStreams(ShimSettings(max_log_streams=2))
    streams.admit()
    a, b = Mock(), Mock()
    streams.open.update({a, b})
    with pytest.raises(ApiError) as full:
        streams.admit()
    assert (full.value.status, full.value.reason, full.value.headers) == (
        503, "too many log streams", {"Retry-After": "30"}
    )  # fmt: skip
    assert full.value.message == "This shim reads at most 2 scanner logs live at once; try again later."
    streams.open.discard(b)
    streams.admit()
    streams.close()
    a.cancel.assert_called_once_with()  # the open reads end with the shim
    with pytest.raises(ApiError) as stopping:
        streams.admit()
    assert (stopping.value.status, stopping.value.reason) == (503, "shutting down")
    assert stopping.value.message == "This shim is stopping; read the log again."
    with pytest.raises(ApiError):
        LogStreams(ShimSettings(max_log_streams=0)).admit()


def test_the_keeper_queues_an_ended_scanner_once_and_forgets_a_deleted_pod() -> None:
    keeper = LogKeeper(Mock(), OperatorSettings(), None, time.time)
    container = names.container_name(SCAN)
    running, done = [{"name": container, "state": {"running": {}}}], {"reason": "Completed", "exitCode": 0}
    keeper.observe(pod(running), deleted=False)
    assert keeper._queue.qsize() == 0
    for _ in range(2):
        keeper.observe(pod([{"name": container, "state": {"terminated": done}}]), deleted=False)
    assert keeper._queue.qsize() == 1 and keeper._pending[("ns", "p")][1] is False
    keeper.observe(pod([{"name": container, "state": {"terminated": done}}]), deleted=True)
    assert keeper._queue.qsize() == 1 and keeper._pending[("ns", "p")][1] is True  # gone: forgotten once kept
