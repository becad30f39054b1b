"""Log lines of the shim and the operator: text, or JSON lines (`SKYSCAN_LOG_FORMAT=json`) with the same
fields from both processes, and credentials masked as a second line of defence (no source logs them).
A `CleanRecord` (the shim's access log, a line a request) is vetted where it is made: the formatters
write it with no redaction pass.

A JSON line holds `timestamp`, `level`, `severity` (kopf's JSON name and values), `logger`, `message`,
and when known `scan_id`, `object` (kopf's reference of the object a line of its own is about) and
`exception`. A line is about a scan when it carries `scan_id`: `extra=about(scan_id)`, or kopf's object
reference of a Scan, or of the Job or Pod made for one.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import sys
import threading
import time
import traceback
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, Literal

from skyscan import model

LogFormat = Literal["text", "json"]
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
REDACTED = "[redacted]"
# What an access-log line carries besides its message (see the shim's access logger).
ACCESS_FIELDS = ("method", "route", "status", "duration_ms", "principal")

# Bearer tokens, JWTs, presigned URLs' signatures, secrets in query strings or forms, DSN passwords.
_REDACTIONS = [
    (re.compile(r"(?i)\b(bearer\s+)[^\s'\",]+"), rf"\1{REDACTED}"),
    (re.compile(r"\beyJ[\w-]+\.[\w-]+\.[\w-]*"), REDACTED),
    (
        re.compile(r"(?i)\b(signature|token|access_token|client_secret|password)=[^&\s'\",]+"),
        rf"\1={REDACTED}",
    ),
    (re.compile(r"(?i)\b(postgres(?:ql)?://[^:/@\s]*:)[^@\s]+@"), rf"\1{REDACTED}@"),
]


# Characters that would end a text log line or rewrite it on a terminal: a request's path (a scan id
# in it) or a header could otherwise forge a whole line.
_CONTROL = re.compile(r"[\x00-\x1f\x7f\x85\u2028\u2029]")


def one_line(text: str) -> str:
    """`text` with control characters escaped as Python writes them (`\\n`, `\\x1b`)."""
    if text.isprintable():  # none of them is: most text needs no search
        return text
    return _CONTROL.sub(lambda m: repr(m.group())[1:-1], text)


def redact(text: str) -> str:
    for pattern, replacement in _REDACTIONS:
        text = pattern.sub(replacement, text)
    return text


# What a CleanRecord holds besides its name, level, message, time and fields: no caller, thread, process.
_CLEAN_BASE: dict[str, object] = {
    "args": None, "pathname": "", "filename": "", "module": "", "exc_info": None, "exc_text": None,
    "stack_info": None, "lineno": 0, "funcName": None, "thread": None, "threadName": None,
    "processName": None, "process": None,
}  # fmt: skip


class CleanRecord(logging.LogRecord):
    """A record whose source vouches for it: its message holds no secret and no character that would
    break a line, its fields (`extra`) no secret; only a `scan_id` among them may hold what a client
    sent, and it is escaped where it is written. Formatters write it without a redaction pass.

    Made a request, so made cheaply: the attributes LogRecord's constructor would compute from a caller
    (there is none) are constants, and all of them are one dictionary made at once."""

    def __init__(self, name: str, level: int, message: str, **fields: object) -> None:
        created = time.time()
        self.__dict__ = {
            **_CLEAN_BASE, **fields, "name": name, "msg": message, "levelno": level,
            "levelname": logging.getLevelName(level), "created": created,
            "msecs": int((created - int(created)) * 1000) + 0.0,
            "relativeCreated": (created - logging._startTime) * 1000,  # type: ignore[attr-defined]
        }  # fmt: skip


def about(scan_id: str) -> dict[str, str]:
    """`extra` of a log call about one scan."""
    return {"scan_id": scan_id}


def _severity(levelno: int) -> str:
    """kopf's JSON severity names."""
    for limit, name in ((logging.DEBUG, "debug"), (logging.INFO, "info"), (logging.WARNING, "warn")):
        if levelno <= limit:
            return name
    return "error" if levelno <= logging.ERROR else "fatal"


def scan_id_of_ref(ref: dict[str, Any]) -> str | None:
    """The scan a kopf object reference is about: a Scan, or the Job (`skyscan-<id>`) or one of its
    Pods (`skyscan-<id>-<suffix>`) made for a scan."""
    kind, name = ref.get("kind"), str(ref.get("name") or "")
    if kind == model.KIND:
        return name or None
    if kind in ("Job", "Pod") and name.startswith("skyscan-"):
        rest = name.removeprefix("skyscan-")
        return rest.rsplit("-", 1)[0] if kind == "Pod" and "-" in rest else rest
    return None


def scan_id_of(record: logging.LogRecord) -> str | None:
    scan_id = getattr(record, "scan_id", None)
    if scan_id is None and isinstance(ref := getattr(record, "k8s_ref", None), dict):
        scan_id = scan_id_of_ref(ref)
    return None if scan_id is None else str(scan_id)


class _SecondStamp:
    """A time's text to the second, made once a second: a line a request would otherwise convert and
    format the same second again and again."""

    def __init__(self, render: Callable[[int], str]) -> None:
        self.render, self.second, self.text = render, -1, ""

    def __call__(self, created: float) -> str:
        if (second := int(created)) != self.second:
            self.second, self.text = second, self.render(second)
        return self.text


_JSON = json.JSONEncoder(default=str)  # json.dumps(default=...) would build an encoder a line


def _vetted(record: logging.LogRecord) -> str:
    """The record's message, redacted unless its source vetted it."""
    message = record.getMessage()
    return message if type(record) is CleanRecord else redact(message)


class JsonFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__()
        self.stamp = _SecondStamp(lambda s: datetime.fromtimestamp(s, UTC).strftime("%Y-%m-%dT%H:%M:%S"))

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "timestamp": f"{self.stamp(record.created)}.{int(record.msecs):03d}+00:00",  # ISO 8601, UTC
            "level": record.levelname,
            "severity": _severity(record.levelno),
            "logger": record.name,
            "message": _vetted(record),
        }
        if (scan_id := scan_id_of(record)) is not None:
            line["scan_id"] = scan_id
        if isinstance(ref := getattr(record, "k8s_ref", None), dict):
            line["object"] = {k: ref.get(k) for k in ("kind", "namespace", "name")}
        if record.exc_info:
            line["exception"] = redact(self.formatException(record.exc_info))
        for field in ACCESS_FIELDS:
            if (value := getattr(record, field, None)) is not None:
                line[field] = value
        return _JSON.encode(line)

    def info_line(self, name: str, created: float, message: str, fields: dict[str, Any]) -> str:
        """What `format` writes of a CleanRecord at INFO of these, made with no record."""
        line: dict[str, Any] = {
            "timestamp": f"{self.stamp(created)}.{int((created - int(created)) * 1000):03d}+00:00",
            "level": "INFO", "severity": "info", "logger": name, "message": message,
        }  # fmt: skip
        if (scan_id := fields.get("scan_id")) is not None:
            line["scan_id"] = str(scan_id)
        for field in ACCESS_FIELDS:
            if (value := fields.get(field)) is not None:
                line[field] = value
        return _JSON.encode(line)


def _continued(text: str) -> str:
    """A traceback's lines, each indented and escaped: an exception's message can quote what a client
    sent, and only a record's first line starts at the margin."""
    return "\n".join(f"    {one_line(line)}" for line in text.split("\n"))


class TextFormatter(logging.Formatter):
    """One line a record, the only one at the margin (a traceback follows on indented lines): the message
    and the scan id are escaped by `one_line`, so what a client sent can never start a line."""

    def __init__(self) -> None:
        super().__init__(TEXT_FORMAT)
        self.stamp = _SecondStamp(lambda s: time.strftime(self.default_time_format, self.converter(s)))

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        """logging's own text (local time, `2026-11-25 00:00:00,000`), its seconds made once a second."""
        if datefmt is not None:
            return super().formatTime(record, datefmt)
        return f"{self.stamp(record.created)},{int(record.msecs):03d}"

    def formatMessage(self, record: logging.LogRecord) -> str:
        return self._line(record, record.asctime, one_line(record.message))

    @staticmethod
    def _line(record: logging.LogRecord, asctime: str, message: str) -> str:
        """TEXT_FORMAT's line (`message` escaped), and the scan it is about unless the message names it."""
        fields = {"asctime": asctime, "levelname": record.levelname, "name": record.name, "message": message}
        line = TEXT_FORMAT % fields
        scan_id = scan_id_of(record)
        return line if scan_id is None or scan_id in message else f"{line} [scan {one_line(scan_id)}]"

    def info_line(self, name: str, created: float, message: str, fields: dict[str, Any]) -> str:
        """What `format` writes of a CleanRecord at INFO of these, made with no record."""
        line = f"{self.stamp(created)},{int((created - int(created)) * 1000):03d} INFO {name}: {message}"
        scan_id = fields.get("scan_id")
        return line if scan_id is None or scan_id in message else f"{line} [scan {one_line(str(scan_id))}]"

    def formatException(self, ei: Any) -> str:
        return _continued(super().formatException(ei))

    def formatStack(self, stack_info: str) -> str:
        return _continued(super().formatStack(stack_info))

    def format(self, record: logging.LogRecord) -> str:
        if type(record) is CleanRecord and not record.exc_info and not record.stack_info:
            return self._line(record, self.formatTime(record), record.getMessage())
        return redact(super().format(record))


class BatchedStreamHandler(logging.StreamHandler[Any]):
    """A stream handler that formats a record where it is logged and leaves the writing to a thread of
    its own, which writes the lines gathered over `interval` seconds at once: a line a request costs
    the event loop no system call and never waits for a slow reader of the stream. A WARNING or worse,
    `flush()` (logging's shutdown) and more than `most` lines waiting write everything at once, in
    order. A process killed outright loses at most `interval` seconds of lines."""

    def __init__(self, stream: Any = None, interval: float = 0.2, most: int = 10_000) -> None:
        super().__init__(stream)
        self.interval, self.most = interval, most
        self._pending: list[str] = []
        self._pending_lock = threading.Lock()  # the loop appends while the writer takes the lines
        self._writing = threading.Lock()  # one write at a time: lines leave in the order they came
        self._waiting = threading.Event()  # set when a line arrives to no line waiting
        self._closing = threading.Event()
        self._writer = threading.Thread(target=self._write_batches, name="log-writer", daemon=True)
        self._writer.start()

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = self.format(record) + self.terminator
        except Exception:
            self.handleError(record)
            return
        self.add(line, record.levelno >= logging.WARNING)

    def add(self, line: str, now: bool = False) -> None:
        """A formatted line (its terminator included) to write with the next batch; `now`: at once."""
        with self._pending_lock:
            self._pending.append(line)
            waiting = len(self._pending)
        if waiting == 1:
            self._waiting.set()
        if now or waiting > self.most:
            self._write()

    def flush(self) -> None:
        self._write()

    def close(self) -> None:
        self._closing.set()
        self._waiting.set()
        if self._writer is not threading.current_thread():
            self._writer.join(timeout=5)
        self._write()
        super().close()

    def _write(self) -> None:
        with self._writing:
            with self._pending_lock:
                lines, self._pending = self._pending, []
            try:
                if lines:
                    self.stream.write("".join(lines))
                self.stream.flush()
            except Exception:  # as logging's own handlers: a broken stream is told of, never raised
                self._told(lines)

    @staticmethod
    def _told(lines: list[str]) -> None:
        if logging.raiseExceptions:
            with contextlib.suppress(Exception):  # stderr may be the stream that broke
                traceback.print_exc(file=sys.stderr)
                sys.stderr.write(f"--- {len(lines)} log lines could not be written\n")

    def _write_batches(self) -> None:
        while not self._closing.is_set():
            self._waiting.wait()
            self._closing.wait(self.interval)  # let the lines of the next moments join this write
            self._waiting.clear()  # before taking them: a line after this sets it again
            self._write()


InfoLine = Callable[[str, dict[str, Any]], None]  # a CleanRecord's message and fields, at INFO


def info_lines(logger: logging.Logger) -> InfoLine | None:
    """A writer of `logger`'s clean INFO lines that makes no record and takes no turn through logging's
    handlers, filters and locks (a line a request costs a third as much), when all of them would reach
    one `BatchedStreamHandler` with one of these formatters and nothing else: no filter, no other
    handler. None otherwise: log CleanRecords. Whether INFO is on is the caller's to ask; the writer
    holds the handlers as they are now (it is made once a connection)."""
    handlers: list[logging.Handler] = []
    current: logging.Logger | None = logger
    while current is not None:
        if current.filters:
            return None
        handlers.extend(current.handlers)
        current = current.parent if current.propagate else None
    if len(handlers) != 1 or type(handler := handlers[0]) is not BatchedStreamHandler:
        return None
    formatter = handler.formatter
    if (
        handler.filters
        or handler.level > logging.INFO
        or type(formatter) not in (TextFormatter, JsonFormatter)
    ):
        return None
    line, name, add, end = formatter.info_line, logger.name, handler.add, handler.terminator  # type: ignore[union-attr]

    def write(message: str, fields: dict[str, Any]) -> None:
        add(line(name, time.time(), message, fields) + end)

    return write


def configure(log_format: LogFormat, level: str | int = logging.INFO, *, batched: bool = False) -> None:
    """One handler on the root logger, writing to stderr in `log_format`; `batched`: written by a thread
    of its own (`BatchedStreamHandler`: the shim logs a line a request)."""
    handler = BatchedStreamHandler() if batched else logging.StreamHandler()
    handler.setFormatter(JsonFormatter() if log_format == "json" else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    # Neither format writes a record's thread or process: a record need not look them up (a third of
    # the cost of making one, and the shim makes one a request).
    logging.logThreads = logging.logProcesses = logging.logMultiprocessing = False
    logging.captureWarnings(True)  # a library's warning is a log line too, not a bare line on stderr
