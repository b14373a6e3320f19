"""Security headers on every answer: a strict CSP on pages, one that lets /docs load."""

from __future__ import annotations

from fastapi.testclient import TestClient

from hbmwatch.api.main import create_app
from hbmwatch.store.store import Store
from tests.test_api import settings_for

STRICT = (
    "default-src 'none'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
    "frame-ancestors 'none'"
)


def test_every_answer_carries_the_security_headers(store: Store) -> None:
    with TestClient(create_app(settings_for(store), store)) as client:
        answers = {
            "page": client.get("/incidents/nope"),  # the incident page (its 404 is HTML too)
            "json": client.get("/api/v1/devices"),
            "error": client.get("/api/v1/query", params={"query": "1bad"}),
            "unauthorized": client.post("/api/v1/silences", json={}),
            "docs": client.get("/docs"),
        }
        for name, r in answers.items():
            assert r.headers["x-content-type-options"] == "nosniff", name
            assert r.headers["x-frame-options"] == "DENY", name
            assert r.headers["referrer-policy"] == "no-referrer", name
            csp = r.headers["content-security-policy"]
            assert "frame-ancestors 'none'" in csp and "default-src 'none'" in csp, name
        assert answers["page"].headers["content-type"].startswith("text/html")
        assert answers["page"].headers["content-security-policy"].startswith(STRICT)
        assert "script-src" not in answers["page"].headers["content-security-policy"]
        docs = answers["docs"].headers["content-security-policy"]
        assert "script-src 'self' 'unsafe-inline';" in docs and "https:" not in docs
        assert "/docs/static/swagger-ui-bundle.js" in answers["docs"].text  # served here
        assert "connect-src 'self'" in docs
