"""ASGI middleware: the token checked before the body is read, a cap on request bodies,
security headers on every response, and request counts and latency for /metrics."""

from __future__ import annotations

import json
import time
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from hbmwatch.api.deps import Scope as TokenScope
from hbmwatch.api.deps import granted_scope
from hbmwatch.settings import Settings

#: Methods that change state: all need a write or admin token.
WRITE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
#: Prometheus' read API takes queries as form POSTs (Grafana sends them so): reads, not writes.
READ_POST_PREFIX = "/prometheus/api/v1/"


class BodyGuard:
    """Check the bearer token before any body is read, then cap the body.

    A write without a valid token gets its 401 at once (with a read token, its 403): its body
    is never read, so uploads without the right to write cost the server nothing.  A read
    without a valid token may carry at most ``unauthenticated_bytes``; with one,
    ``max_bytes`` (413 past either).  The route still checks the exact scope (admin calls).
    """

    def __init__(self, app: ASGIApp, settings: Settings) -> None:
        self.app = app
        self.settings = settings
        self.max_bytes = settings.api.max_body_bytes
        self.unauthenticated_bytes = min(
            settings.api.max_unauthenticated_body_bytes, settings.api.max_body_bytes
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        token = bearer_token(headers.get(b"authorization"))
        granted = granted_scope(self.settings, token)
        writes = scope["method"] in WRITE_METHODS and not scope["path"].startswith(READ_POST_PREFIX)
        if granted is None and writes:
            message = (
                "the bearer token is not valid"
                if token
                else "this call needs a write token (Authorization: Bearer ...)"
            )
            await send_error(
                send, 401, "unauthorized", message,
                {"WWW-Authenticate": "Bearer", "Connection": "close"},  # the body stays unread
            )  # fmt: skip
            return
        if granted is TokenScope.READ and writes:
            message = "a read token cannot do this; it needs write"
            await send_error(send, 403, "forbidden", message, {"Connection": "close"})
            return
        cap = self.max_bytes if granted is not None else self.unauthenticated_bytes
        declared = headers.get(b"content-length")
        if (
            declared is not None
            and declared.isascii()
            and declared.isdigit()
            and int(declared) > cap
        ):
            await self._refuse(send, cap)
            return
        seen = 0

        async def counted() -> Message:
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > cap:
                raise _TooLarge
            return message

        try:
            await self.app(scope, counted, send)
        except _TooLarge:
            await self._refuse(send, cap)

    async def _refuse(self, send: Send, cap: int) -> None:
        hint = "send smaller batches" if cap == self.max_bytes else "send a valid token"
        message = f"the body is over {cap} bytes; {hint}"
        await send_error(send, 413, "payload_too_large", message, {"Connection": "close"})


def bearer_token(header: bytes | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header, None for any other."""
    if not header:
        return None
    scheme, _, token = header.decode("latin-1").partition(" ")
    if scheme.lower() != "bearer":
        return None
    return token.strip() or None


async def send_error(
    send: Send, status: int, code: str, message: str, headers: dict[str, str] | None = None
) -> None:
    """An answer in the API's error model, from middleware (outside FastAPI's handlers)."""
    body = json.dumps({"error": {"code": code, "detail": {}, "message": message}}).encode()
    raw = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    raw += [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body})


class _TooLarge(Exception):
    pass


#: The incident pages and every API answer: no scripts, nothing from elsewhere, no framing.
STRICT_CSP = (
    "default-src 'none'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
    "frame-ancestors 'none'; base-uri 'none'; form-action 'self'"
)
#: /docs and /redoc start Swagger UI and ReDoc inline, from files hbmwatch serves itself
#: (fastapi-offline's copies): nothing comes from a CDN, so they work without internet.
DOCS_CSP = (
    "default-src 'none'; script-src 'self' 'unsafe-inline'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data:; connect-src 'self'; worker-src blob:; frame-ancestors 'none'; "
    "base-uri 'none'"
)
DOCS_PATHS = ("/docs", "/redoc")
_COMMON_HEADERS = [
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"no-referrer"),
]


class SecurityHeaders:
    """CSP, X-Frame-Options, nosniff and Referrer-Policy on every response, errors included."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        docs = scope["path"].startswith(DOCS_PATHS)
        csp = (DOCS_CSP if docs else STRICT_CSP).encode()

        async def secured(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [h for h in message.get("headers", []) if h[0].lower() not in _OURS]
                message = {**message, "headers": [*headers, *_COMMON_HEADERS,
                                                  (b"content-security-policy", csp)]}  # fmt: skip
            await send(message)

        await self.app(scope, receive, secured)


_OURS = frozenset(name for name, _ in _COMMON_HEADERS) | {b"content-security-policy"}


class RequestMetrics:
    """``hbmwatch_http_requests_total`` and ``..._duration_seconds`` by route template."""

    def __init__(self, app: ASGIApp, registry: CollectorRegistry) -> None:
        self.app = app
        self.requests = Counter(
            "hbmwatch_http_requests",
            "HTTP requests served.",
            ["method", "route", "status"],
            registry=registry,
        )
        self.seconds = Histogram(
            "hbmwatch_http_request_duration_seconds",
            "Time to answer an HTTP request.",
            ["method", "route"],
            registry=registry,
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status: dict[str, Any] = {"code": 500}

        async def recorded(message: Message) -> None:
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, recorded)
        finally:
            route = getattr(scope.get("route"), "path", "unmatched")
            method = scope["method"]
            self.requests.labels(method, route, str(status["code"])).inc()
            self.seconds.labels(method, route).observe(time.perf_counter() - started)
