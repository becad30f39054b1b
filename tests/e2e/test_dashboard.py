"""The dashboard in a real browser: Debian's chromium driven by Playwright, against the session's local
stack. A login link opens it once; the scans table finds scans by run/event and by classifier, showing
every user-supplied string as text; the page runs under its Content-Security-Policy with no console
error. Each test's screenshot is kept in .skyscan/test-artifacts/."""

from __future__ import annotations

import random
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.sync_api import Browser, ConsoleMessage, Page, expect, sync_playwright

from skyscan_local.audit_probes import poll
from skyscan_local.stack_provision import new_login_link
from tests.e2e.conftest import Stack, scan_request, workers_held

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
# As root, on a closed network: no sandbox (root), and none of the background traffic that the machine
# refuses (Google's hosts, component updates).
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]  # fmt: skip
XSS = "<img src=x onerror=f()>"  # the issue's `alert(1)` one, within a classifier value's 25 characters


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    if not Path(CHROMIUM).exists():
        pytest.skip("DASHBOARD NOT TESTED: no chromium (`make test` installs Debian's as root)")
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        yield launched
        launched.close()


# Chromium aborts its requests when the machine's interfaces change, and says so in the console; the
# real node's tests beside these add and remove a veth for every Pod. The page takes it as any lost
# connection (shown, then followed again); the tests' own checks then tell whether it recovered.
NETWORK_CHANGED = "net::ERR_NETWORK_CHANGED"
ARTIFACTS = Path(__file__).resolve().parents[2] / ".skyscan" / "test-artifacts"  # kept after the run


@contextmanager
def watched_tab(
    browser: Browser, request: pytest.FixtureRequest, problem: Callable[[ConsoleMessage], bool]
) -> Iterator[Page]:
    """A 1280x800 tab; at its end its screenshot is kept, and the test fails on a page error, a dialog or
    a console error that `problem` names one."""
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    opened = context.new_page()
    opened.set_default_timeout(30_000)
    problems: list[str] = []

    def console(m: ConsoleMessage) -> None:
        if m.type == "error" and NETWORK_CHANGED not in m.text and problem(m):
            problems.append(m.text)

    opened.on("console", console)
    opened.on("pageerror", lambda e: problems.append(str(e)))
    opened.on("dialog", lambda d: problems.append(f"a dialog: {d.message}"))
    yield opened
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    opened.screenshot(path=str(ARTIFACTS / f"{request.node.name}.png"), full_page=True)
    context.close()
    assert problems == [], problems


@pytest.fixture
def page(browser: Browser, request: pytest.FixtureRequest) -> Iterator[Page]:
    # Chromium logs every 4xx answer to a fetch as an error; a 400 is the page's own doing only when it
    # shows the service's refusal (the launch form's test checks that it does).
    refusal = "Failed to load resource: the server responded with a status of 400"
    with watched_tab(browser, request, lambda m: refusal not in m.text) as opened:
        yield opened


# The elements reaching beyond the window's right edge (their tags and classes): none at phone width.
WIDER_THAN_THE_SCREEN = """() => [...document.body.querySelectorAll('*')]
  .filter((e) => e.getBoundingClientRect().right > window.innerWidth + 1)
  .map((e) => `${e.tagName}.${e.className}`)"""


def launched(stack: Stack, **changes: Any) -> str:
    answer = httpx.post(
        f"{stack.url}/scan",
        json=scan_request(**changes),
        headers={"Authorization": f"Bearer {stack.user_token}"},
        timeout=30,
    )
    assert answer.status_code == 200, answer.text
    return str(answer.json()["scan_id"])


def event_metadata(stack: Stack, scan_id: str) -> dict[str, Any]:
    """The scan's event metadata, once the operator has read its event."""
    headers = {"Authorization": f"Bearer {stack.user_token}"}

    def probe() -> dict[str, Any] | None:
        manifest = httpx.get(f"{stack.url}/scan/{scan_id}/manifest", headers=headers, timeout=30).json()
        return manifest.get("event_metadata") or None

    found = poll(probe, 60)
    assert found, f"scan {scan_id} has no event metadata after 60 s"
    return dict(found)


def rows(page: Page) -> list[str]:
    return [str(r.get_attribute("data-scan-id")) for r in page.locator("table.scans tbody tr").all()]


def test_a_login_link_opens_the_scans_table_once_and_finds_scans_showing_their_strings_as_text(
    stack: Stack, page: Page
) -> None:
    event_id = random.randrange(10**6, 10**9)
    event = {"value": {"data": {"run_id": 777, "event_id": event_id, "mjd": 60000.5}}}  # its own event id
    marked = launched(stack, classifiers={"note": XSS, "suite": "dashboard"}, event_live_json=event)
    other = launched(stack, classifiers={"suite": "elsewhere"})
    link = new_login_link(stack.settings, stack.user_token, stack.url)

    answer = page.goto(link)
    assert answer is not None
    csp = answer.headers["content-security-policy"]
    assert "script-src 'self'" in csp and "unsafe-inline" not in csp
    assert answer.headers["x-frame-options"] == "DENY"
    page.locator(f'table.scans tr[data-scan-id="{marked}"]').wait_for()
    # The code left the address bar; the token is held by this tab only.
    assert page.evaluate("location.hash") == "#/scans"
    assert page.evaluate("sessionStorage.getItem('skyscan.token')") == stack.user_token
    assert page.evaluate("localStorage.length") == 0
    row = page.locator(f'table.scans tr[data-scan-id="{marked}"]')
    assert f"note={XSS}" in row.inner_text()
    assert page.locator("table.scans img").count() == 0  # text, not markup

    page.fill("input[name=classifier]", "suite=dashboard")
    page.click("form.filters button[type=submit]")
    expect(page.locator(f'table.scans tr[data-scan-id="{other}"]')).to_have_count(0)
    assert marked in rows(page)

    # A scan launched now joins the table, and its row follows it to its final result: no reload.
    arriving = launched(stack, classifiers={"suite": "dashboard"}, nsides={"8": 0})
    state = page.locator(f'table.scans tr[data-scan-id="{arriving}"] td.state')
    expect(state).to_have_count(1, timeout=30_000)
    expect(state).to_have_text("SCAN_HAS_FINAL_RESULT", timeout=90_000)
    assert page.evaluate("performance.getEntriesByType('navigation').length") == 1  # the same page load

    meta = event_metadata(stack, marked)  # as the scan's event gives them
    page.fill("input[name=classifier]", "")
    # By keyboard alone: Tab from the page's start reaches the form, Enter finds.
    page.focus("a.brand")  # the page's first stop
    for _ in range(12):
        page.keyboard.press("Tab")
        if page.evaluate("document.activeElement.name") == "run_id":
            break
    assert page.evaluate("document.activeElement.name") == "run_id"
    page.keyboard.type(str(meta["run_id"]))
    page.keyboard.press("Tab")
    page.keyboard.type(str(meta["event_id"]))
    page.keyboard.press("Enter")
    expect(page.locator("table.scans tbody tr")).to_have_count(1)
    assert rows(page) == [marked]
    expect(row.locator("td.state")).not_to_have_text("…")  # its state, read from its status

    page.set_viewport_size({"width": 390, "height": 844})  # a phone: the page is no wider (the table scrolls)
    assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth + 1")
    page.set_viewport_size({"width": 1280, "height": 800})

    # The link worked once: another tab that opens it is asked to log in, with the service's words.
    again = page.context.new_page()
    again.goto(link)
    again.get_by_text("The link was used, has expired or is unknown").wait_for()
    assert again.evaluate("sessionStorage.getItem('skyscan.token')") is None
    again.close()


def test_a_scan_launched_from_the_form_reaches_its_final_result_on_its_page_and_another_is_aborted(
    stack: Stack, page: Page
) -> None:
    page.goto(new_login_link(stack.settings, stack.user_token, stack.url))
    page.locator("table.scans").wait_for()
    page.click("a[href='#/launch']")
    page.fill("input[name=nsides]", "8:0")
    page.fill("input[name=classifiers]", "suite=launched")
    page.fill("textarea[name=event]", '{"value": {"data": {"run_id": 123, "event_id": 4, "mjd": 60000.5}}}')
    page.fill("input[name=max_pixel_reco_time]", "-5")
    page.click("form.launch button[type=submit]")
    # The service's own refusal, at the field it names.
    expect(page.locator("#r-max_pixel_reco_time")).to_contain_text("'max_pixel_reco_time'")
    page.fill("input[name=max_pixel_reco_time]", "600")
    page.click("form.launch button[type=submit]")
    page.wait_for_url("**/ui/#/scan/*")
    expect(page.locator(".facts .state")).to_have_text("SCAN_HAS_FINAL_RESULT", timeout=90_000)  # no reload
    expect(page.locator("section.result h2")).to_have_text("Final result")
    bars = page.locator("section[aria-label='Progress'] progress")
    expect(bars).to_have_count(1)  # nside 8 only, every pixel done
    assert bars.first.get_attribute("value") == bars.first.get_attribute("max") != "1"
    history = page.locator("section[aria-label='State over time'] li").all_inner_texts()
    assert "created" in history[0] and any("SCAN_HAS_FINAL_RESULT" in h for h in history), history
    expect(page.locator("table.taskforces tbody tr")).not_to_have_count(0)
    # Readable at phone width: nothing wider than the screen, the actions and facts still there.
    page.set_viewport_size({"width": 390, "height": 844})
    assert page.evaluate(WIDER_THAN_THE_SCREEN) == []
    page.set_viewport_size({"width": 1280, "height": 800})
    assert page.locator("text=Abort").count() == 0  # a finished scan has nothing to abort

    with workers_held(stack):  # so the scan is mid-way
        running = launched(stack)
        page.goto(f"{stack.url}/ui/#/scan/{running}")
        taskforces = f"{stack.url}/scan/{running}/wms/taskforces"
        headers = {"Authorization": f"Bearer {stack.user_token}"}
        assert poll(lambda: httpx.get(taskforces, headers=headers, timeout=30).json()["taskforces"], 60)
        before = len(httpx.get(taskforces, headers=headers, timeout=30).json()["taskforces"])
        page.click("text=Add workers")
        page.fill("input[name=n_workers]", "3")
        page.click("text=Yes, add workers")
        expect(page.locator("form[aria-label='Add workers']")).to_have_count(0)  # done: the form closes
        added = poll(
            lambda: len(httpx.get(taskforces, headers=headers, timeout=30).json()["taskforces"]) > before, 60
        )
        assert added, "no taskforce for the added workers after 60 s"
        assert page.locator("#notice").is_hidden()
        page.click("text=Abort")
        page.click("text=Yes, abort this scan")
        expect(page.locator(".facts dd").nth(1)).to_have_text("yes")  # Deleted


def test_a_viewer_sees_no_action_and_a_scanners_token_is_refused(stack: Stack, page: Page) -> None:
    with workers_held(stack):  # so the scan is running, with every action open to a user
        running = launched(stack)
        page.goto(new_login_link(stack.settings, stack.viewer_token, stack.url))
        page.locator("table.scans").wait_for()
        assert page.locator("#launch-link").is_hidden()
        page.goto(f"{stack.url}/ui/#/scan/{running}")
        expect(page.locator(".facts .state")).not_to_be_empty()
        for action in ("Abort", "Rescan", "Add workers"):
            assert page.get_by_role("button", name=action).count() == 0, action

        user = page.context.new_page()  # a user, in another tab (a tab's token is its own)
        user.goto(new_login_link(stack.settings, stack.user_token, stack.url))
        user.locator("table.scans").wait_for()
        user.goto(f"{stack.url}/ui/#/scan/{running}")
        expect(user.get_by_role("button", name="Abort")).to_be_visible()
        user.close()

    scanner = page.context.new_page()
    scanner.goto(new_login_link(stack.settings, stack.system_token, stack.url))
    scanner.get_by_text("The dashboard is for people").wait_for()
    assert scanner.evaluate("sessionStorage.getItem('skyscan.token')") is None
    scanner.close()
