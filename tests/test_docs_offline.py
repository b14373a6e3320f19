"""/docs and /redoc render in Chromium with every request off 127.0.0.1 refused.

They used to load Swagger UI and ReDoc from a CDN: without internet, a blank page. Now the
files are package data hbmwatch serves itself; the browser here may reach nothing else.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from hbmwatch.api.main import create_app
from hbmwatch.settings import Settings, StoreSettings
from tests.conftest import Clock, make_store
from tests.test_incident_page import CHROMIUM, CHROMIUM_ARGS, require_chromium, serving

pytestmark = pytest.mark.slow


@pytest.fixture
def base_url(tmp_path: Path) -> Iterator[str]:
    store = make_store(f"sqlite:///{tmp_path / 'db.sqlite'}", Clock())
    app = create_app(Settings(store=StoreSettings(url=store.settings.url)), store)
    with serving(app) as url:
        yield url
    store.close()


def _render(base_url: str, path: str, ready: str) -> tuple[list[str], str]:
    """Open ``path`` with only 127.0.0.1 reachable; (refused URLs, text once ``ready`` shows)."""
    from playwright.sync_api import Route, sync_playwright

    refused: list[str] = []

    def only_local(route: Route) -> None:
        if urlsplit(route.request.url).hostname == "127.0.0.1":
            route.continue_()
        else:
            refused.append(route.request.url)
            route.abort()

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            page = browser.new_context().new_page()
            page.route("**/*", only_local)
            page.goto(f"{base_url}{path}", timeout=120_000)
            page.wait_for_selector(ready, timeout=120_000)
            return refused, page.inner_text("body")
        finally:
            browser.close()


def test_swagger_ui_renders_the_api_offline(base_url: str) -> None:
    require_chromium()
    refused, text = _render(base_url, "/docs", ".opblock")
    assert not refused, refused
    assert "/api/v1/incidents" in text and "/readyz" in text


def test_redoc_renders_the_api_offline(base_url: str) -> None:
    require_chromium()
    refused, text = _render(base_url, "/redoc", "[data-section-id]")
    assert not refused, refused
    assert "hbmwatch" in text and "incidents" in text.lower()
