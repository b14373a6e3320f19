"""The scrape's HTTP client: one keep-alive HTTP/1.1 connection a target, GET only.

A scrape is one GET of a small page, hundreds a second.  httpx spent ~1.5 ms of CPU on
each (request and URL objects, the connection pool, h11's events, anyio), more than
parsing a 73-line vLLM page costs, and aiohttp 0.4 ms.  This client (0.09 ms) is an
``asyncio.Protocol`` that writes a request built once per URL and reads the answer
straight from its buffer (``scripts/bench_fetch.py``; figures in docs/collector.md).
What it does: Content-Length, chunked and read-until-close bodies, gzip/deflate bodies,
a size limit enforced while reading, TLS with the caller's context, keep-alive (a
connection the target closed is replaced, and a GET on a reused one that dies before
answering is sent once more).  What the caller does: the deadline (scrape.py's
``Deadline`` around ``get``), decoding the text.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import ssl
import zlib
from collections.abc import Mapping
from typing import Any, NamedTuple, Protocol
from urllib.parse import quote, unquote, urlencode, urlsplit

import httpx

#: Response headers larger than this are refused (a trickling target's head never ends).
MAX_HEAD_BYTES = 64 * 2**10
Params = list[tuple[str, str]] | None
#: What stays as it is in a request's path and query (RFC 3986's reserved and unreserved).
_SAFE = "/%:@!$&'()*+,;=-._~"


class PageError(Exception):
    """A scrape that got an answer, but not a page: HTTP status, size limit."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


class FetchError(Exception):
    """No answer: the connection failed, closed early, or spoke no HTTP/1.1."""


class Client(Protocol):
    """What a scrape needs of an HTTP client."""

    async def get(self, url: str, limit: int, params: Params = None) -> bytes: ...

    async def aclose(self) -> None: ...


class HttpxClient:
    """``get`` through an httpx transport: the simulator's in-process one (no sockets)."""

    def __init__(
        self, transport: httpx.AsyncBaseTransport, tls: ssl.SSLContext, headers: Mapping[str, str]
    ) -> None:
        self._client = httpx.AsyncClient(transport=transport, verify=tls, headers=headers)

    async def get(self, url: str, limit: int, params: Params = None) -> bytes:
        try:
            async with self._client.stream("GET", url, params=params, timeout=None) as r:
                if r.status_code != 200:
                    raise PageError(f"HTTP {r.status_code}", "http_status")
                chunks, size = [], 0
                async for chunk in r.aiter_bytes():
                    size += len(chunk)
                    if size > limit:
                        raise _too_large(limit)
                    chunks.append(chunk)
        except httpx.TimeoutException as exc:
            raise TimeoutError from exc
        except httpx.HTTPError as exc:
            message = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            raise FetchError(message) from exc
        return b"".join(chunks)

    async def aclose(self) -> None:
        await self._client.aclose()


class _Route(NamedTuple):
    """Where a URL goes and the bytes that ask for it, built once per URL."""

    host: str
    port: int
    tls: bool
    request: bytes


class _Connection(asyncio.Protocol):
    """A socket's bytes into one buffer; ``wait_for`` wakes the reader when enough came."""

    def __init__(self) -> None:
        self.buffer = bytearray()
        self.received = 0  # bytes ever received: did a request get any answer?
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.error: BaseException | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._want = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        self.received += len(data)
        if len(self.buffer) >= self._want:
            self._wake()

    def eof_received(self) -> bool:
        self.closed = True
        self._wake()
        return False  # close our side too

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed, self.error = True, exc
        self._wake()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def wait_for(self, size: int) -> None:
        """Until the buffer holds ``size`` bytes; ``FetchError`` if the target closes first."""
        while len(self.buffer) < size:
            if self.closed:
                raise FetchError(_closed_message(self.error))
            self._want = size
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter, self._want = None, 0

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()


def _closed_message(error: BaseException | None) -> str:
    if error is None:
        return "RemoteProtocolError: the target closed the connection before the page ended"
    return f"ReadError: {type(error).__name__}: {error}"


class HttpClient:
    """GET pages of one target over one kept-alive connection (a scrape at a time)."""

    def __init__(self, tls: ssl.SSLContext, headers: Mapping[str, str]) -> None:
        self.tls = tls
        self.headers = dict(headers)
        self._routes: dict[tuple[str, str], _Route] = {}
        self._idle: tuple[_Route, _Connection] | None = None

    async def get(self, url: str, limit: int, params: Params = None) -> bytes:
        """The 200 answer's body (decompressed); ``PageError`` for another status or one
        over ``limit`` bytes, ``FetchError`` when no answer came."""
        route = self._route(url, params)
        conn, reused = await self._connection(route)
        before = conn.received
        try:
            conn.transport.write(route.request)  # type: ignore[union-attr]
            body, keep = await _response(conn, limit)
        except FetchError:
            conn.close()
            if not reused or conn.received != before:
                raise
            return await self.get(url, limit, params)  # a stale keep-alive: a fresh one, once
        except BaseException:  # a page error, the deadline: the connection is mid-answer
            conn.close()
            raise
        if keep and not conn.closed:
            self._idle = (route, conn)
        else:
            conn.close()
        return body

    async def aclose(self) -> None:
        if self._idle is not None:
            self._idle[1].close()
            self._idle = None

    def _route(self, url: str, params: Params) -> _Route:
        key = (url, urlencode(params) if params else "")
        route = self._routes.get(key)
        if route is None:
            route = self._routes[key] = _build_route(url, key[1], self.headers)
        return route

    async def _connection(self, route: _Route) -> tuple[_Connection, bool]:
        idle, self._idle = self._idle, None
        if idle is not None:
            conn = idle[1]
            if idle[0][:3] == route[:3] and not conn.closed and not conn.buffer:
                return conn, True
            conn.close()
        loop = asyncio.get_running_loop()
        tls = self.tls if route.tls else None
        try:
            _, conn = await loop.create_connection(
                _Connection, route.host, route.port, ssl=tls,
                server_hostname=route.host if tls else None,
            )  # fmt: skip
        except (OSError, ssl.SSLError) as exc:
            raise FetchError(f"ConnectError: {exc}") from exc
        return conn, False


def _build_route(url: str, query: str, headers: Mapping[str, str]) -> _Route:
    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError as exc:  # a port that is not a number
        raise FetchError(f"InvalidURL: {url!r}: {exc}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise FetchError(f"UnsupportedProtocol: {url!r} is not an http(s) URL")
    tls = parts.scheme == "https"
    port = port or (443 if tls else 80)
    path = quote(parts.path or "/", safe=_SAFE)
    query = "&".join(q for q in (quote(parts.query, safe=_SAFE + "?"), query) if q)
    target = f"{path}?{query}" if query else path
    host = parts.hostname
    host_header = f"[{host}]" if ":" in host else host
    if parts.port:
        host_header += f":{port}"
    lines = [f"GET {target} HTTP/1.1", f"Host: {host_header}", "Accept-Encoding: gzip, deflate",
             "User-Agent: hbmwatch", *(f"{k}: {v}" for k, v in headers.items())]  # fmt: skip
    if parts.username is not None:  # http://user:password@host/: basic auth, as httpx did
        secret = f"{unquote(parts.username)}:{unquote(parts.password or '')}".encode()
        lines.append(f"Authorization: Basic {base64.b64encode(secret).decode()}")
    try:
        request = ("\r\n".join(lines) + "\r\n\r\n").encode("ascii")
    except UnicodeEncodeError:
        raise FetchError(f"InvalidURL: {url!r} has a host that is not ASCII") from None
    return _Route(host, port, tls, request)


async def _response(conn: _Connection, limit: int) -> tuple[bytes, bool]:
    """The body of a 200 answer and whether the connection may be kept."""
    while True:
        status, headers, keep = await _head(conn)
        if not 100 <= status < 200:
            break  # an interim 1xx answer is skipped
    if status != 200:
        raise PageError(f"HTTP {status}", "http_status")
    decoder = _decoder(headers.get("content-encoding", "identity").strip().lower())
    #: Compressed bytes past this inflate past the limit (gzip adds no more than this).
    cap = limit if decoder is None else limit + 1024
    if "chunked" in headers.get("transfer-encoding", "").lower():
        body = await _chunked(conn, cap)
    elif "content-length" in headers:
        body = await _sized(conn, _length(headers["content-length"]), cap)
    else:
        body, keep = await _until_closed(conn, cap), False
    if decoder is not None:
        body = _inflate(decoder, body, limit)
    if len(body) > limit:
        raise PageError(f"page larger than {limit} bytes", "page_too_large")
    return body, keep


async def _head(conn: _Connection) -> tuple[int, dict[str, str], bool]:
    """The status line and headers (names lower-cased), consumed from the buffer."""
    start = 0
    while (end := conn.buffer.find(b"\r\n\r\n", start)) < 0:
        if len(conn.buffer) > MAX_HEAD_BYTES:
            raise FetchError(f"RemoteProtocolError: response headers over {MAX_HEAD_BYTES} bytes")
        start = max(0, len(conn.buffer) - 3)
        await conn.wait_for(len(conn.buffer) + 1)
    head = bytes(conn.buffer[:end]).decode("latin-1")
    del conn.buffer[: end + 4]
    status_line, *lines = head.split("\r\n")
    version, _, rest = status_line.partition(" ")
    code = rest[:3]
    if not version.startswith("HTTP/1.") or not code.isdigit():
        raise FetchError(f"RemoteProtocolError: not an HTTP/1.1 answer: {status_line[:80]!r}")
    headers: dict[str, str] = {}
    for line in lines:
        name, sep, value = line.partition(":")
        if sep:
            headers[name.strip().lower()] = value.strip()
    connection = headers.get("connection", "").lower()
    keep = "close" not in connection and (version != "HTTP/1.0" or "keep-alive" in connection)
    return int(code), headers, keep


def _too_large(limit: int) -> PageError:
    return PageError(f"page larger than {limit} bytes", "page_too_large")


def _length(value: str) -> int:
    if not value.isdigit():
        raise FetchError(f"RemoteProtocolError: bad Content-Length {value[:40]!r}")
    return int(value)


async def _sized(conn: _Connection, length: int, cap: int) -> bytes:
    if length > cap:
        raise _too_large(cap)
    await conn.wait_for(length)
    body = bytes(conn.buffer[:length])
    del conn.buffer[:length]
    return body


async def _until_closed(conn: _Connection, cap: int) -> bytes:
    """A body without a length: it ends where the target closes the connection."""
    while not conn.closed:
        if len(conn.buffer) > cap:
            raise _too_large(cap)
        with contextlib.suppress(FetchError):  # closed: the body is complete
            await conn.wait_for(len(conn.buffer) + 1)
    if len(conn.buffer) > cap:
        raise _too_large(cap)
    body = bytes(conn.buffer)
    conn.buffer.clear()
    return body


async def _chunked(conn: _Connection, cap: int) -> bytes:
    """A chunked body, each chunk's size checked against the limit before it is read."""
    parts: list[bytes] = []
    size = 0
    while True:
        eol = await _line_end(conn)
        line = bytes(conn.buffer[:eol]).split(b";", 1)[0].strip()
        try:
            chunk = int(line, 16)
        except ValueError:
            raise FetchError(f"RemoteProtocolError: bad chunk size {line[:40]!r}") from None
        if chunk == 0:
            break
        size += chunk
        if size > cap:
            raise _too_large(cap)
        await conn.wait_for(eol + 2 + chunk + 2)
        parts.append(bytes(conn.buffer[eol + 2 : eol + 2 + chunk]))
        del conn.buffer[: eol + 2 + chunk + 2]
    del conn.buffer[: eol + 2]
    while (eol := await _line_end(conn)) > 0:  # trailers, up to their empty line
        del conn.buffer[: eol + 2]
    del conn.buffer[:2]
    return b"".join(parts)


async def _line_end(conn: _Connection) -> int:
    start = 0
    while (eol := conn.buffer.find(b"\r\n", start)) < 0:
        if len(conn.buffer) > MAX_HEAD_BYTES:
            raise FetchError("RemoteProtocolError: a chunk-size or trailer line too long")
        start = max(0, len(conn.buffer) - 1)
        await conn.wait_for(len(conn.buffer) + 1)
    return eol


def _decoder(coding: str) -> Any:
    if coding in ("gzip", "x-gzip"):
        return zlib.decompressobj(zlib.MAX_WBITS | 16)
    if coding == "deflate":
        return zlib.decompressobj()
    return None  # identity, or one we did not ask for: passed through, as httpx does


def _inflate(decoder: Any, data: bytes, limit: int) -> bytes:
    """``data`` inflated, stopping at ``limit`` + 1 bytes (a zip bomb stops there)."""
    try:
        out: bytes = decoder.decompress(data, limit + 1)
        if len(out) <= limit:
            out += decoder.flush()
    except zlib.error as exc:
        raise FetchError(f"DecodingError: {exc}") from exc
    return out
