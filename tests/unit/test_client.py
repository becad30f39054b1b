"""The client against a real local HTTP server: which requests are retried, error bodies, configuration,
and following a scan by its event stream or by polling."""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from skyscan_client import config
from skyscan_client.client import Client, SkyscanError, Unreachable
from skyscan_client.events import parse_sse

pytestmark = pytest.mark.timeout(30)

# (method, path) -> what to do for the n-th request (0-based): (status, body), (status, body, headers)
# or "drop" (close the socket)
Plan = Callable[[str, str, int, bytes], tuple[int, Any] | tuple[int, Any, dict[str, str]] | str]


class Server:
    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        self.seen: Counter[tuple[str, str]] = Counter()
        self.bodies: list[Any] = []
        self.headers: list[dict[str, str]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def answer(self) -> None:
                key = (self.command, self.path)
                n = outer.seen[key]
                outer.seen[key] += 1
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                outer.bodies.append(json.loads(raw) if raw else None)
                outer.headers.append(dict(self.headers))
                what = outer.plan(self.command, self.path, n, raw)
                if what == "drop":
                    self.close_connection = True
                    self.connection.shutdown(2)
                    return
                assert not isinstance(what, str)
                status, body, *more = what
                if isinstance(body, bytes):  # a raw event stream
                    self.send_response(status)
                    self.send_header("Content-Type", "text/event-stream")
                    self.end_headers()
                    self.wfile.write(body)
                    self.close_connection = True
                    return
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for name, value in (more[0] if more else {}).items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = answer

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def serve() -> Iterator[Callable[[Plan], Server]]:
    servers: list[Server] = []

    def start(plan: Plan) -> Server:
        servers.append(Server(plan))
        return servers[-1]

    yield start
    for s in servers:
        s.close()


def client(server: Server, retries: int = 3) -> Client:
    return Client(server.url, "t0ken", retries=retries, backoff=0.001, timeout=5)


def error(status: int, reason: str) -> tuple[int, dict[str, str]]:
    return status, {"error": "Whatever", "reason": reason, "message": f"because {reason}"}


def failing_then_ok(failures: int, how: tuple[int, Any] | str) -> Plan:
    def plan(method: str, path: str, n: int, body: bytes) -> tuple[int, Any] | str:
        return how if n < failures else (200, {"ok": n, "manifests": []})

    return plan


@pytest.mark.parametrize("status", [502, 503, 504])
def test_reads_are_retried_on_gateway_errors(serve: Callable[[Plan], Server], status: int) -> None:
    server = serve(failing_then_ok(2, error(status, "busy")))
    with client(server) as c:
        assert c.status("s1")["ok"] == 2  # type: ignore[typeddict-item]
    assert server.seen[("GET", "/scan/s1/status")] == 3
    assert server.headers[-1]["Authorization"] == "Bearer t0ken"


def test_retries_are_bounded(serve: Callable[[Plan], Server]) -> None:
    server = serve(failing_then_ok(100, error(503, "kubernetes API unavailable")))
    with client(server, retries=2) as c, pytest.raises(SkyscanError) as caught:
        c.manifest("s1")
    assert server.seen[("GET", "/scan/s1/manifest")] == 3
    assert (caught.value.status, caught.value.reason) == (503, "kubernetes API unavailable")


def test_idempotent_writes_are_retried(serve: Callable[[Plan], Server]) -> None:
    server = serve(failing_then_ok(1, error(503, "busy")))
    with client(server) as c:
        c.put_result("s1", {"nside-8": {}}, is_final=True)
        c.abort("s2")
        assert c.find({"event_metadata.run_id": 1}) == []
    assert server.seen == Counter(
        {("PUT", "/scan/s1/result"): 2, ("DELETE", "/scan/s2"): 2, ("POST", "/scans/find"): 2}
    )
    assert server.bodies[-1] == {"filter": {"event_metadata.run_id": 1}, "include_deleted": False}


def test_writes_that_are_not_idempotent_are_sent_once(serve: Callable[[Plan], Server]) -> None:
    server = serve(failing_then_ok(1, error(503, "busy")))
    with client(server) as c:
        calls: list[Callable[[], Any]] = [
            lambda: c.launch({"docker_tag": "latest"}),
            lambda: c.rescan("s1", replace=True),
            lambda: c.add_workers("s1", "osg", 3),
            lambda: c.patch_manifest("s1", progress={"summary": "x"}),
            lambda: c.set_workflow_id("s1", "w", "http://wms"),
        ]
        for call in calls:
            with pytest.raises(SkyscanError) as caught:
                call()
            assert caught.value.status == 503
    assert set(server.seen.values()) == {1}, server.seen
    assert server.bodies[2] == {"cluster_location": "osg", "n_workers": 3, "no_redirect": False}


def test_a_dropped_connection_retries_a_read_but_not_a_launch(serve: Callable[[Plan], Server]) -> None:
    server = serve(failing_then_ok(1, "drop"))
    with client(server) as c:
        assert c.result("s1")["ok"] == 1  # type: ignore[typeddict-item]
        with pytest.raises(Unreachable):
            c.launch({"docker_tag": "latest"})
    assert server.seen[("GET", "/scan/s1/result")] == 2
    assert server.seen[("POST", "/scan")] == 1


def test_nothing_listening_is_unreachable_after_the_retries() -> None:
    with Client("http://127.0.0.1:9", "t", retries=1, backoff=0.001) as c, pytest.raises(Unreachable):
        c.launch({})  # never sent, so a retry could not start a second scan


@pytest.mark.parametrize("status", [400, 409, 429, 500])
def test_other_errors_are_answers_and_sent_once(serve: Callable[[Plan], Server], status: int) -> None:
    server = serve(failing_then_ok(1, error(status, "no")))
    with client(server) as c, pytest.raises(SkyscanError) as caught:
        c.status("s1")
    assert caught.value.status == status and server.seen[("GET", "/scan/s1/status")] == 1


def test_a_connection_that_never_opened_is_tried_again_even_for_a_launch() -> None:
    started = time.monotonic()
    with Client("http://127.0.0.1:9", "t", retries=2, backoff=0.4) as c, pytest.raises(Unreachable):
        c.launch({})
    # A refused connection fails at once: only the two pauses (at least 0.2 s and 0.4 s) take time.
    assert time.monotonic() - started >= 0.6


def test_the_pause_is_the_servers_retry_after_up_to_max_backoff(serve: Callable[[Plan], Server]) -> None:
    def busy_for(seconds: str) -> Plan:
        def plan(method: str, path: str, n: int, body: bytes) -> tuple[int, Any, dict[str, str]]:
            if n == 0:
                return (*error(503, "busy"), {"Retry-After": seconds})
            return 200, {"ok": n}, {}

        return plan

    with client(serve(busy_for("1"))) as c:  # backoff 0.001 s: the wait is the server's
        started = time.monotonic()
        c.status("s1")
        assert time.monotonic() - started >= 1.0
    with Client(serve(busy_for("30")).url, "t", backoff=0.001, max_backoff=0.2) as c:
        started = time.monotonic()
        c.status("s1")
        assert time.monotonic() - started < 5.0


def test_the_error_body_and_status_are_carried(serve: Callable[[Plan], Server]) -> None:
    server = serve(lambda m, p, n, b: error(404, "scan not found"))
    with client(server) as c, pytest.raises(SkyscanError) as caught:
        c.scan_request("nope")
    assert caught.value.status == 404
    assert caught.value.body == {
        "error": "Whatever",
        "reason": "scan not found",
        "message": "because scan not found",
    }
    assert server.seen[("GET", "/scan-request/nope")] == 1  # a 404 is an answer, not retried


def test_a_non_json_error_still_raises_with_the_status(serve: Callable[[Plan], Server]) -> None:
    server = serve(lambda m, p, n, b: (418, "short and stout"))
    with client(server) as c, pytest.raises(SkyscanError) as caught:
        c.root()
    assert (caught.value.status, caught.value.error) == (418, "I'm a Teapot")


def test_query_flags_and_projection(serve: Callable[[Plan], Server]) -> None:
    server = serve(lambda m, p, n, b: (200, {}))
    with client(server) as c:
        c.manifest("s1", projection=["scan_id", "progress"], include_deleted=True)
        c.result("s1")
    assert ("GET", "/scan/s1/manifest?include_deleted=true&projection=scan_id%7Cprogress") in server.seen
    assert ("GET", "/scan/s1/result") in server.seen


# -- configuration ------------------------------------------------------------------------------------


def test_configuration_arguments_then_environment_then_env_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("SKYSCAN_URL", "SKYSCAN_TOKEN", "SKYSCAN_USER_TOKEN", "SKYSCAN_LOCAL_DIR"):
        monkeypatch.delenv(name, raising=False)
    (tmp_path / ".skyscan").mkdir()
    (tmp_path / ".skyscan" / "env").write_text(
        "export SKYSCAN_URL=http://127.0.0.1:8080/\nexport SKYSCAN_USER_TOKEN='from file'\n"
    )
    deeper = tmp_path / "a" / "b"
    deeper.mkdir(parents=True)
    monkeypatch.chdir(deeper)
    assert config.resolve() == config.Config("http://127.0.0.1:8080", "from file")
    monkeypatch.setenv("SKYSCAN_TOKEN", "from env")
    assert config.resolve().token == "from env"
    assert config.resolve("http://other", "arg") == config.Config("http://other", "arg")
    monkeypatch.setenv("SKYSCAN_LOCAL_DIR", str(tmp_path / "elsewhere"))
    with pytest.raises(config.ConfigError, match="SKYSCAN_URL"):
        config.resolve()


# -- following a scan ---------------------------------------------------------------------------------


def sse(*docs: dict[str, Any], end: bool = True) -> bytes:
    out = ": hello\n\n"
    for i, doc in enumerate(docs):
        out += f"id: {i}\nevent: scan\ndata: {json.dumps(doc)}\n\n"
    return (out + ("event: end\ndata: {}\n\n" if end else "")).encode()


def status(state: str, **more: Any) -> dict[str, Any]:
    return {"scan_state": state, "is_deleted": False, "wms_deactivated": None, "scan_complete": False} | more


def message(state: str, **more: Any) -> dict[str, Any]:
    return {"scan_id": "s1", "status": status(state, **more), "progress": None, "result": None}


def test_parse_sse_joins_data_lines_and_skips_comments() -> None:
    lines = [
        ": keepalive",
        "",
        "id: 7",
        "event: scan",
        'data: {"a":',
        "data: 1}",
        "",
        "event: end",
        "data: {}",
        "",
    ]
    got = list(parse_sse(lines))
    assert [(m.event, m.data, m.id) for m in got] == [("scan", '{"a":\n1}', "7"), ("end", "{}", "7")]


def test_events_from_the_stream_until_its_end(serve: Callable[[Plan], Server]) -> None:
    final = message("SCAN_HAS_FINAL_RESULT", scan_complete=True)
    body = sse(message("PENDING__PRESTARTUP"), message("PENDING__PRESTARTUP"), final)
    server = serve(lambda m, p, n, b: (200, body))
    with client(server) as c:
        got = list(c.events("s1"))
    assert [e.state for e in got] == ["PENDING__PRESTARTUP", "SCAN_HAS_FINAL_RESULT"]  # unchanged ones folded
    assert got[-1].has_final_result and got[-1].version == "2"
    assert server.headers[0]["Accept"] == "text/event-stream"
    assert not [k for k in server.seen if "/status" in k[1]]


def test_a_broken_stream_is_reopened(serve: Callable[[Plan], Server]) -> None:
    def plan(m: str, p: str, n: int, b: bytes) -> tuple[int, Any]:
        if n == 0:
            return 200, sse(message("PENDING__PRESTARTUP"), end=False)
        return 200, sse(message("PENDING__PRESTARTUP"), message("ABORTED__PRESTARTUP", is_deleted=True))

    server = serve(plan)
    with client(server) as c:
        got = list(c.events("s1"))
    assert [e.state for e in got] == ["PENDING__PRESTARTUP", "ABORTED__PRESTARTUP"]
    assert got[-1].aborted and server.seen[("GET", "/scan/s1/events")] == 2


def test_a_busy_shim_is_asked_again_then_polled(serve: Callable[[Plan], Server]) -> None:
    def plan(m: str, p: str, n: int, b: bytes) -> tuple[int, Any]:
        if p.endswith("/events"):
            return error(503, "too many event streams")
        if "/status" in p:
            return 200, status("SCAN_HAS_FINAL_RESULT", scan_complete=True)
        return 200, {"scan_id": "s1", "progress": None}

    server = serve(plan)
    with client(server, retries=2) as c:
        assert [e.state for e in c.events("s1")] == ["SCAN_HAS_FINAL_RESULT"]
    assert server.seen[("GET", "/scan/s1/events")] == 3 and server.seen[("GET", "/scan/s1/status")] == 1


@pytest.mark.parametrize("missing", [404, 405])
def test_without_the_events_route_it_polls(serve: Callable[[Plan], Server], missing: int) -> None:
    states = ["IN_PROGRESS__PARTIAL_RESULT_GENERATED"] * 2 + ["SCAN_HAS_FINAL_RESULT"]

    def plan(m: str, p: str, n: int, b: bytes) -> tuple[int, Any]:
        if p.endswith("/events"):
            return error(missing, "no such route")
        if "/status" in p:
            return 200, status(states[min(n, 2)], scan_complete=n >= 2)
        return 200, {"scan_id": "s1", "progress": {"summary": f"report {min(n, 1)}"}}

    server = serve(plan)
    with client(server) as c:
        got = list(c.events("s1", poll_interval=0.01))
    assert [e.state for e in got] == [states[0], states[0], "SCAN_HAS_FINAL_RESULT"]
    assert [(e.progress or {}).get("summary") for e in got] == ["report 0", "report 1", "report 1"]
    assert got[-1].result == {"is_final": True}
    assert server.seen[("GET", "/scan/s1/status")] == 3


def test_an_unknown_scan_raises_whether_streamed_or_polled(serve: Callable[[Plan], Server]) -> None:
    server = serve(lambda m, p, n, b: error(404, "scan not found"))
    with client(server) as c, pytest.raises(SkyscanError) as caught:
        next(c.events("nope"))
    assert caught.value.status == 404


def test_after_a_write_every_request_asks_for_at_least_the_version_it_wrote(
    serve: Callable[[Plan], Server],
) -> None:
    """Read-your-writes across shim replicas (README, More than one shim)."""
    versions = {"/scan/a/actions/add-workers": "120", "/scan/b/actions/add-workers": "90"}

    def plan(method: str, path: str, n: int, body: bytes) -> tuple[int, Any, dict[str, str]]:
        if method == "POST" and path in versions:
            return 200, {}, {"Skyscan-Version": versions[path]}
        return 200, {"scan_state": "PENDING"}, {}

    server = serve(plan)
    with Client(server.url, "t") as c:
        c.status("a")
        c.add_workers("a", "osg", 1)
        c.status("a")
        c.add_workers("b", "osg", 1)  # an older version than the highest seen: the highest stays
        c.status("b")
    asked = [h.get("Skyscan-Min-Version") for h in server.headers]
    assert asked == [None, None, "120", "120", "120"]
