"""The dashboard's files and login links (`api_shim.handlers.ui`), over real HTTP from a real shim: the
files with their security headers, nothing else under /ui/, and a login code exchanged once, before it
expires, for its token."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import api_shim
from api_shim.auth import token_hash
from skyscan_local.stack_provision import UI_LOGIN_FILE, new_login_link
from skyscan_local.stack_settings import LocalStackSettings
from tests.integration.shim.conftest import MakeShim, ShimUnderTest

CSP = "Content-Security-Policy"


def assert_secured(headers: object) -> None:
    csp = headers[CSP]  # type: ignore[index]
    assert "script-src 'self'" in csp and "frame-ancestors 'none'" in csp and "unsafe-inline" not in csp
    assert headers["X-Content-Type-Options"] == "nosniff"  # type: ignore[index]
    assert headers["X-Frame-Options"] == "DENY"  # type: ignore[index]


async def test_the_page_and_its_files_are_served_with_their_types_and_security_headers(
    shim: ShimUnderTest,
) -> None:
    page = await shim.call("GET", "/ui/", as_=None)
    assert page.status == 200 and page.headers["Content-Type"].startswith("text/html")
    assert b'<script type="module" src="app.js">' in page.body and b"<script>" not in page.body
    assert_secured(page.headers)
    for name, kind in (
        ("app.js", "text/javascript"),
        ("style.css", "text/css"),
        ("dom.js", "text/javascript"),
    ):
        got = await shim.call("GET", f"/ui/{name}", as_=None)
        assert (got.status, got.headers["Content-Type"].split(";")[0]) == (200, kind), name
        assert_secured(got.headers)
    # Every module is preloaded (fetched at once, not import by import), and each preload is served.
    preloaded = set(re.findall(rb'<link rel="modulepreload" href="([^"]+)">', page.body))
    shipped = {p.name.encode() for p in (Path(api_shim.__file__).parent / "ui_assets").glob("*.js")}
    assert preloaded == shipped
    for name in preloaded:
        assert (await shim.call("GET", f"/ui/{name.decode()}", as_=None)).status == 200, name
    moved = await shim.call("GET", "/ui", as_=None)
    assert (moved.status, moved.headers["Location"]) == (301, "/ui/")


async def test_nothing_else_is_served_under_ui(shim: ShimUnderTest) -> None:
    for path in ("/ui/nope.js", "/ui/..%2Fapp.py", "/ui/login", "/ui/__init__.py"):
        got = await shim.call("GET", path, as_=None)
        assert got.status == 404, path
        assert got.body["error"] == "Not Found", path
        assert_secured(got.headers)


async def test_without_a_login_file_there_are_no_login_links(shim: ShimUnderTest) -> None:
    got = await shim.call("POST", "/ui/login", as_=None, json_body={"code": "anything"})
    assert got.status == 404 and got.body["reason"] == "login link not found"


async def test_a_login_code_opens_its_token_once_and_only_before_it_expires(
    make_shim: MakeShim, tmp_path: Path
) -> None:
    login_file = tmp_path / "ui-login.json"
    now = time.time()
    codes = {
        token_hash("fresh"): {"token": "the-user-token", "expires_at": now + 600},
        token_hash("old"): {"token": "the-user-token", "expires_at": now - 1},
    }
    login_file.write_text(json.dumps({"codes": codes}))
    shim = await make_shim(ui_login_file=login_file)
    got = await shim.call("POST", "/ui/login", as_=None, json_body={"code": "fresh"})
    assert (got.status, got.body) == (200, {"token": "the-user-token"})
    assert_secured(got.headers)
    for code in ("fresh", "old", "unknown"):  # spent, expired, never made
        again = await shim.call("POST", "/ui/login", as_=None, json_body={"code": code})
        assert (again.status, again.body["reason"]) == (401, "login link not valid"), code
    for body in ({}, {"code": ""}, {"code": "x" * 129}, {"code": 5}, {"code": "fresh", "more": 1}):
        refused = await shim.call("POST", "/ui/login", as_=None, json_body=body)
        assert refused.status == 400, body
    login_file.write_text("not json")
    broken = await shim.call("POST", "/ui/login", as_=None, json_body={"code": "fresh"})
    assert broken.status == 401


async def test_every_link_make_up_printed_opens_once_until_it_expires(
    make_shim: MakeShim, tmp_path: Path
) -> None:
    """`make demo` runs `make up` again, which prints a new link: the one printed before still opens."""
    settings = LocalStackSettings(SKYSCAN_LOCAL_DIR=tmp_path)
    login_file = tmp_path / UI_LOGIN_FILE
    login_file.write_text(
        json.dumps({"codes": {token_hash("old"): {"token": "t", "expires_at": time.time() - 1}}})
    )
    first = new_login_link(settings, "the-user-token", "http://shim")
    second = new_login_link(settings, "the-user-token", "http://shim")
    assert token_hash("old") not in json.loads(login_file.read_text())["codes"]  # the expired one is gone
    shim = await make_shim(ui_login_file=login_file)
    statuses = []
    for link in (first, second, first):  # each opens once
        got = await shim.call("POST", "/ui/login", as_=None, json_body={"code": link.split("#code=")[1]})
        statuses.append((got.status, got.body.get("token")))
    assert statuses == [(200, "the-user-token"), (200, "the-user-token"), (401, None)]


async def test_the_session_names_a_person_and_the_actions_the_route_table_lets_them_take(
    shim: ShimUnderTest,
) -> None:
    user = await shim.call("GET", "/ui/session")
    assert (user.status, user.body) == (
        200,
        {"name": "alice", "roles": ["user"], "may": ["abort", "add_workers", "launch", "rescan"]},
    )
    assert_secured(user.headers)
    viewer = await shim.call("GET", "/ui/session", as_="viewer")
    assert (viewer.status, viewer.body) == (200, {"name": "shifter", "roles": ["viewer"], "may": []})
    system = await shim.call("GET", "/ui/session", as_="system")
    assert (system.status, system.body["reason"]) == (403, "authorization failed")
    for who in (None, "not-a-token"):
        nobody = await shim.call("GET", "/ui/session", as_=who)
        assert (nobody.status, nobody.headers["WWW-Authenticate"]) == (401, "Bearer"), who


async def test_a_viewer_reads_what_a_user_reads_and_changes_nothing(shim: ShimUnderTest) -> None:
    scan_id = (await shim.launch())["scan_id"]
    for path in (f"/scan/{scan_id}", f"/scan/{scan_id}/status", f"/scan-request/{scan_id}", "/scans/backlog"):
        read = await shim.call("GET", path, as_="viewer")
        assert read.status == 200, path
    found = await shim.call("POST", "/scans/find", as_="viewer", json_body={"filter": {"scan_id": scan_id}})
    assert [m["scan_id"] for m in found.body["manifests"]] == [scan_id]
    for method, path, body in (
        ("POST", "/scan", {}),
        ("DELETE", f"/scan/{scan_id}", {}),
        ("POST", f"/scan/{scan_id}/actions/rescan", {}),
        ("POST", f"/scan/{scan_id}/actions/add-workers", {"n_workers": 1, "cluster_location": "osg"}),
        ("PATCH", f"/scan/{scan_id}/manifest", {"progress": {}}),
    ):
        refused = await shim.call(method, path, as_="viewer", json_body=body)
        assert (refused.status, refused.body["reason"]) == (403, "authorization failed"), path
    assert (await shim.call("GET", f"/scan/{scan_id}/status")).body["is_deleted"] is False
