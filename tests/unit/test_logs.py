"""The shared log format: JSON lines with the documented fields, scan ids from `extra` or kopf's object
references, and credentials masked even when a caller logs them."""

from __future__ import annotations

import io
import json
import logging
import sys
import threading
from datetime import UTC, datetime

import pytest

from skyscan import logs
from tests.helpers import eventually

FIELDS = {"timestamp", "level", "severity", "logger", "message"}


def record(msg: str, *args: object, level: int = logging.INFO, **extra: object) -> logging.LogRecord:
    r = logging.LogRecord("skyscan.test", level, __file__, 1, msg, args, None)
    r.__dict__.update(extra)
    return r


def as_json(r: logging.LogRecord) -> dict[str, object]:
    line = logs.JsonFormatter().format(r)
    assert "\n" not in line
    parsed: dict[str, object] = json.loads(line)
    return parsed


def test_a_json_line_has_the_documented_fields() -> None:
    line = as_json(record("reconciled %s", "a1", level=logging.WARNING))
    assert set(line) == FIELDS
    assert line["message"] == "reconciled a1"
    assert (line["level"], line["severity"], line["logger"]) == ("WARNING", "warn", "skyscan.test")
    assert str(line["timestamp"]).endswith("+00:00")


def test_scan_id_from_extra_and_access_fields() -> None:
    extra = {
        **logs.about("0194x1"),
        "method": "GET",
        "route": "/scan/{scan_id}",
        "status": 200,
        "duration_ms": 1.5,
    }
    line = as_json(record("GET", **extra))
    assert line["scan_id"] == "0194x1"
    assert (line["route"], line["status"], line["duration_ms"]) == ("/scan/{scan_id}", 200, 1.5)


@pytest.mark.parametrize(
    ("kind", "name", "scan_id"),
    [
        ("Scan", "0194x1", "0194x1"),
        ("Job", "skyscan-0194x1", "0194x1"),
        ("Pod", "skyscan-0194x1-k2x9q", "0194x1"),
        ("Pod", "other-pod", None),
        ("ConfigMap", "skyscan-0194x1", None),
    ],
)
def test_kopf_object_references_map_to_scan_ids(kind: str, name: str, scan_id: str | None) -> None:
    ref = {"apiVersion": "v1", "kind": kind, "name": name, "namespace": "ns", "uid": "u"}
    line = as_json(record("Handler succeeded.", k8s_ref=ref, settings=object()))
    assert line["object"] == {"kind": kind, "namespace": "ns", "name": name}
    assert line.get("scan_id") == scan_id


def test_exceptions_are_one_json_field() -> None:
    try:
        raise ValueError("Authorization: Bearer abc.def")
    except ValueError:
        r = record("failed")
        r.exc_info = sys.exc_info()
    line = as_json(r)
    assert "ValueError" in str(line["exception"]) and "abc.def" not in str(line["exception"])


@pytest.mark.parametrize(
    ("text", "secret"),
    [
        ("GET /scan/x/startup.json?expires=17&signature=q9Zk-_w", "q9Zk-_w"),
        ("headers {'Authorization': 'Bearer s3cr3t-tok'}", "s3cr3t-tok"),
        ("token eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJ4In0.c2ln", "eyJhbGciOiJSUzI1NiJ9"),
        ("grant_type=client_credentials&client_secret=hunter2", "hunter2"),
        ("dsn postgresql://skyscan:pa55word@db:5432/skyscan", "pa55word"),
        ("password=pa55word host=db", "pa55word"),
    ],
)
def test_credentials_are_redacted(text: str, secret: str) -> None:
    assert secret not in logs.redact(text)
    assert logs.REDACTED in logs.redact(text)
    assert secret not in as_json(record("%s", text))["message"]  # type: ignore[operator]
    assert secret not in logs.TextFormatter().format(record("%s", text))


def test_redaction_keeps_ordinary_text() -> None:
    text = "archived ns/0194x1: moved to the archive (token_file unset)"
    assert logs.redact(text) == text


def test_text_lines_name_the_scan() -> None:
    line = logs.TextFormatter().format(record("archiving failed", **logs.about("0194x1")))
    assert "INFO skyscan.test: archiving failed [scan 0194x1]" in line


def test_a_text_line_never_holds_a_control_character_a_client_sent() -> None:
    forged = "abc\r\n2026-11-25 00:00:00,000 INFO api_shim.auth: admin\x1b[2K\u2028"
    escaped = "abc\\r\\n2026-11-25 00:00:00,000 INFO api_shim.auth: admin\\x1b[2K\\u2028"
    for r, end in [
        (record("read %s", forged), f"read {escaped}"),
        (record("read", **logs.about(forged)), f"[scan {escaped}]"),
    ]:
        line = logs.TextFormatter().format(r)
        assert "\n" not in line and "\r" not in line and "\x1b" not in line and "\u2028" not in line
        assert line.endswith(end), line
    assert logs.one_line("plain é text") == "plain é text"


def test_an_exception_quoting_a_client_cannot_start_a_line_of_its_own() -> None:
    """Only a record's first line starts at the margin: its traceback's lines are indented and escaped."""
    forged = "2026-11-25 00:00:00,000 INFO api_shim.auth: alice logged in as admin"
    try:
        raise ValueError(f"no scan abc\n{forged}\r\x1b[2K")
    except ValueError:
        r = record("unhandled error on GET /scan/abc")
        r.exc_info = sys.exc_info()
        r.stack_info = f"Stack (most recent call last):\n{forged}"
    text = logs.TextFormatter().format(r)
    first, *rest = text.split("\n")
    assert first.endswith("INFO skyscan.test: unhandled error on GET /scan/abc") and rest, text
    assert all(line.startswith("    ") for line in rest), text
    assert "\r" not in text and "\x1b" not in text
    assert f"    {forged}" in rest and any(line.endswith("\\r\\x1b[2K") for line in rest), rest
    assert any("ValueError: no scan abc" in line for line in rest), rest


@pytest.mark.parametrize(("level", "access_logged"), [("INFO", True), ("WARNING", False)])
def test_the_shims_log_level_decides_whether_requests_are_logged(
    monkeypatch: pytest.MonkeyPatch, level: str, access_logged: bool
) -> None:
    from api_shim.settings import ShimSettings

    monkeypatch.setenv("SKYSCAN_LOG_LEVEL", level)
    root = logging.getLogger()
    handlers, root_level = root.handlers[:], root.level
    try:
        logs.configure("text", ShimSettings().log_level)
        assert logging.getLogger("api_shim.access").isEnabledFor(logging.INFO) is access_logged
    finally:
        root.handlers[:] = handlers
        root.setLevel(root_level)


def test_a_vetted_record_is_written_as_an_ordinary_one_is() -> None:
    """A CleanRecord skips the redaction pass, not the format: the same line, its scan id escaped."""
    forged = "abc\n2026-11-25 00:00:00,000 INFO api_shim.auth: admin"
    fields = {**logs.about(forged), "method": "GET", "route": "/scan/{scan_id}", "status": 404}
    clean = logs.CleanRecord("skyscan.test", logging.INFO, "GET /scan/{scan_id} 404 1.0ms user", **fields)
    ordinary = record("GET /scan/{scan_id} 404 1.0ms user", **fields)
    ordinary.created, ordinary.msecs = clean.created, clean.msecs
    text = logs.TextFormatter()
    assert text.format(clean) == text.format(ordinary)
    tail = "INFO skyscan.test: GET /scan/{scan_id} 404 1.0ms user [scan abc\\n2026-11-25 00:00:00,000 INFO"
    assert text.format(clean).endswith(f"{tail} api_shim.auth: admin]")
    line = as_json(clean)
    assert line == as_json(ordinary) and line["scan_id"] == forged and line["status"] == 404


def test_timestamps_are_loggings_own_though_made_once_a_second() -> None:
    text, as_logging, json_formatter = logs.TextFormatter(), logging.Formatter(), logs.JsonFormatter()
    for created in (1_764_000_000.25, 1_764_000_000.999, 1_764_000_001.0, 1_764_000_001.5, 1_764_003_600.042):
        r = record("at")
        r.created, r.msecs = created, int((created - int(created)) * 1000) + 0.0
        assert text.formatTime(r) == as_logging.formatTime(r)
        stamp = datetime.fromtimestamp(created, UTC).isoformat(timespec="milliseconds")
        assert json.loads(json_formatter.format(r))["timestamp"] == stamp


def test_every_character_that_breaks_a_line_is_escaped() -> None:
    breaking = [chr(c) for c in (*range(0x20), 0x7F, 0x85, 0x2028, 0x2029)]
    for c in breaking:
        escaped = logs.one_line(f"id{c}x")
        assert c not in escaped and escaped == f"id{repr(c)[1:-1]}x", repr(c)


async def test_a_batched_handler_writes_lines_in_order_off_the_callers_thread_and_warnings_at_once() -> None:
    class Stream(io.StringIO):
        def __init__(self) -> None:
            super().__init__()
            self.writers: list[str] = []

        def write(self, text: str) -> int:
            self.writers.append(threading.current_thread().name)
            return super().write(text)

    stream = Stream()
    handler = logs.BatchedStreamHandler(stream, interval=0.5)
    handler.setFormatter(logs.TextFormatter())
    try:
        for i in range(3):
            handler.handle(logs.CleanRecord("api_shim.access", logging.INFO, f"GET / 200 {i}.0ms user"))
        assert stream.getvalue() == ""  # not written by the caller

        async def written() -> bool:
            return stream.getvalue().count("\n") == 3

        await eventually(written, timeout=5, interval=0.01)
        assert stream.writers == ["log-writer"]  # the three lines in one write, by the writer thread
        handler.handle(record("slow answer", level=logging.WARNING))
        assert stream.writers[-1] == threading.current_thread().name  # a warning: written at once
        handler.handle(record("last line"))
        handler.flush()  # as logging's shutdown does
        lines = stream.getvalue().splitlines()
        assert [line.split(": ", 1)[1] for line in lines] == [
            *(f"GET / 200 {i}.0ms user" for i in range(3)), "slow answer", "last line",
        ]  # fmt: skip
    finally:
        handler.close()
    assert not handler._writer.is_alive()


def test_a_batched_handler_holds_at_most_so_many_lines() -> None:
    stream = io.StringIO()
    handler = logs.BatchedStreamHandler(stream, interval=60, most=2)
    try:
        for i in range(2):
            handler.handle(record(f"line {i}"))
        assert stream.getvalue() == ""
        handler.handle(record("line 2"))  # a third waiting: written at once, all of them
        assert stream.getvalue().splitlines() == ["line 0", "line 1", "line 2"]
    finally:
        handler.close()


@pytest.mark.parametrize("formatter", [logs.TextFormatter(), logs.JsonFormatter()], ids=["text", "json"])
def test_an_info_line_made_without_a_record_is_the_records_line(formatter: logs.TextFormatter) -> None:
    access = {"method": "GET", "route": "/scan/{scan_id}/status", "status": 200, "duration_ms": 0.25}
    for scan_id in (None, "s1", "GET", "abc\n2026-11-25 00:00:00,000 INFO api_shim.auth: admin"):
        fields = {**access, "principal": "user", **({} if scan_id is None else logs.about(scan_id))}
        clean = logs.CleanRecord(
            "api_shim.access", logging.INFO, "GET /scan/{scan_id}/status 200 0.2ms user", **fields
        )
        for created in (1_764_000_000.25, 1_764_000_000.999, 1_764_003_600.042):
            clean.created, clean.msecs = created, int((created - int(created)) * 1000) + 0.0
            made = formatter.info_line("api_shim.access", created, clean.getMessage(), fields)
            assert made == formatter.format(clean), (scan_id, created)


def test_info_lines_go_straight_to_the_batched_writer_only_when_nothing_else_sees_them() -> None:
    root, logger = logging.getLogger(), logging.getLogger("skyscan.test.direct")
    handlers, level = root.handlers[:], root.level
    stream = io.StringIO()
    batched = logs.BatchedStreamHandler(stream, interval=60)
    batched.setFormatter(logs.JsonFormatter())
    try:
        root.handlers[:] = [batched]
        write = logs.info_lines(logger)
        assert write is not None
        write("GET / 200 1.0ms user", {"method": "GET", "status": 200, **logs.about("s1")})
        batched.flush()
        line = json.loads(stream.getvalue())
        assert (line["logger"], line["level"], line["message"]) == (
            "skyscan.test.direct",
            "INFO",
            "GET / 200 1.0ms user",
        )
        assert (line["method"], line["status"], line["scan_id"]) == ("GET", 200, "s1")
        seen = logging.Filter("elsewhere")
        for change, undo in (
            (lambda: logger.addHandler(logging.NullHandler()), lambda: logger.handlers.clear()),
            (lambda: root.addFilter(seen), lambda: root.removeFilter(seen)),
            (lambda: batched.addFilter(seen), lambda: batched.removeFilter(seen)),
            (lambda: batched.setLevel(logging.WARNING), lambda: batched.setLevel(logging.NOTSET)),
            (
                lambda: batched.setFormatter(logging.Formatter()),
                lambda: batched.setFormatter(logs.JsonFormatter()),
            ),
        ):
            change()
            assert logs.info_lines(logger) is None
            undo()
            assert logs.info_lines(logger) is not None
        root.handlers[:] = [logging.StreamHandler(stream)]
        assert logs.info_lines(logger) is None
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
        batched.close()
