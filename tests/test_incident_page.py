"""The incident page in a real browser: served by uvicorn, rendered by Chromium, no JavaScript.

On-call open the page from an alert link, often on a locked-down laptop or a phone, so the
browser here runs with JavaScript disabled: everything asserted must be in the HTML and SVG
the server sent.  A screenshot is kept as an artifact (``$HBMWATCH_ARTIFACTS_DIR``, else the
test's tmp dir) for people to look at.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import parse_qs, urlsplit

import pytest
from fastapi import FastAPI

from hbmwatch.api.main import create_app
from hbmwatch.api.server import ApiServer
from hbmwatch.settings import Settings, StoreSettings
from tests.conftest import Clock, make_store
from tests.test_incident_view import P99, TEMP, THROTTLE, scenario

if TYPE_CHECKING:
    from playwright.sync_api import Page

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]  # fmt: skip


def require_chromium() -> None:
    if CHROMIUM.exists():
        return
    message = f"Chromium not available at {CHROMIUM} (apt-get install chromium)"
    if os.environ.get("HBMWATCH_REQUIRE_SERVICES") == "1":
        pytest.fail(message)
    pytest.skip(message)


@contextlib.contextmanager
def serving(app: FastAPI) -> Iterator[str]:
    """``app`` over HTTP on a free 127.0.0.1 port (the API's own server), its base URL."""
    server = ApiServer(app, "127.0.0.1", 0)
    server.start()  # returns once it listens; waits up to 60 s on a busy machine
    try:
        yield f"http://127.0.0.1:{server.port}"
    finally:
        server.stop(timeout=10)


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[str, str]]:
    """(base URL, incident id): the pages router over a SQLite store, on a free port."""
    clock = Clock()
    url = f"sqlite:///{tmp_path / 'hbmwatch.db'}"
    store = make_store(url, clock)
    world = scenario(store, clock)
    app = create_app(Settings(store=StoreSettings(url=url)), store)
    try:
        with serving(app) as base:
            yield base, world.incident_id
    finally:
        store.close()


def artifacts_dir(tmp_path: Path) -> Path:
    folder = Path(os.environ.get("HBMWATCH_ARTIFACTS_DIR") or tmp_path)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@pytest.mark.slow
def test_the_incident_page_in_chromium(served: tuple[str, str], tmp_path: Path) -> None:
    require_chromium()
    from playwright.sync_api import sync_playwright

    base, incident_id = served
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            context = browser.new_context(java_script_enabled=False,
                                          viewport={"width": 1200, "height": 900})  # fmt: skip
            page = context.new_page()
            check_incident_page(page, base, incident_id, artifacts_dir(tmp_path))
            check_not_found_page(page, base)
        finally:
            browser.close()


def check_incident_page(page: Page, base: str, incident_id: str, out: Path) -> None:
    response = page.goto(f"{base}/incidents/{incident_id}")
    assert response is not None and response.status == 200
    assert response.headers["content-type"].startswith("text/html")
    assert page.title().startswith("rack r0 (c0)")  # the title's words are the engine's
    drawn = page.locator("svg.chart polyline").evaluate_all(
        "els => els.map(e => e.getAttribute('data-series'))"
    )
    assert drawn == [P99.text, TEMP.text, THROTTLE.text]
    known = page.locator("#what-we-know").inner_text()
    assert "cooling" in known and "82% confidence" in known
    assert "rack r0 warms as a whole: its coolant" in known
    cooling = page.locator('li.cause[data-cause="cooling"] table.evidence tbody tr').first
    cells = cooling.locator("td").all_inner_texts()
    assert "(threshold 5)" in cells[1] and cells[3:] == ["10 s", "0.84"]  # lead, strength
    detail = page.locator(f'a[href="/api/v1/incidents/{incident_id}"]')
    assert detail.count() == 1
    assert f"POST /api/v1/incidents/{incident_id}/acknowledge" in page.locator("#api").inner_text()
    hrefs = page.locator('a[data-api="query_range"]').evaluate_all(
        "els => els.map(e => e.getAttribute('href'))"
    )
    queries = [parse_qs(urlsplit(h).query) for h in hrefs]
    assert [q["query"] for q in queries] == [[P99.text], [TEMP.text], [THROTTLE.text]]
    assert [q.get("fn") for q in queries] == [None, None, ["rate"]]  # as charted
    assert all(urlsplit(h).path == "/api/v1/query_range" and q["step"] == ["10"]
               for h, q in zip(hrefs, queries, strict=True))  # fmt: skip
    assert page.locator("#timeline tbody tr").count() >= 3  # opened + two alerts joined
    assert page.locator("#alerts tbody tr").count() == 2
    shot = out / "incident-page.png"
    page.screenshot(path=str(shot), full_page=True)
    assert shot.stat().st_size > 10_000
    page.locator("#chart").screenshot(path=str(out / "incident-chart.png"))
    print(f"incident page screenshot: {shot} (the chart alone: incident-chart.png)")


def check_not_found_page(page: Page, base: str) -> None:
    response = page.goto(f"{base}/incidents/inc-does-not-exist")
    assert response is not None and response.status == 404
    assert "No such incident" in page.title()
    assert "inc-does-not-exist" in page.locator("main").inner_text()


def test_text_from_the_store_is_escaped_and_the_page_has_no_script(tmp_path: Path) -> None:
    """Summaries and labels are data: they must never become markup."""
    from fastapi.testclient import TestClient

    from hbmwatch.alerts.runner import Alerting
    from hbmwatch.settings import AlertSettings
    from tests.test_incident_view import GPU, NOW_MS, thermal_finding

    store = make_store(f"sqlite:///{tmp_path / 'hbmwatch.db'}", Clock())
    try:
        hostile = dataclasses.replace(thermal_finding(GPU, NOW_MS - 60_000),
                                      summary='<script>alert(1)</script> & "x"')  # fmt: skip
        alerting = Alerting(store, AlertSettings())
        alerting.start()
        alerting.process([hostile], now_ms=NOW_MS - 60_000)
        (inc,) = store.alerts.incidents()
        settings = Settings(store=StoreSettings(url=str(store.engine.url)))
        app = create_app(settings, store)
        html = TestClient(app).get(f"/incidents/{inc.id}").text
    finally:
        store.close()
    assert "<script" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt; &amp; &#34;x&#34;" in html
