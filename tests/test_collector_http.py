"""The collector's own HTTP client (collector/http.py) against httpx, on the same answers.

Every server here is a real asyncio server on 127.0.0.1 that writes raw bytes, so each
framing (Content-Length, chunked, read-until-close), encoding and failure is exactly what
the test says; httpx, the client the collector used before, reads the same answers.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import ssl
import zlib
from collections.abc import Callable
from pathlib import Path
from urllib.parse import parse_qsl, urlsplit

import httpx
import pytest

from hbmwatch.collector.http import FetchError, HttpClient, PageError
from hbmwatch.collector.scrape import Deadline

PAGE = b"".join(b'vllm:num_requests_running{model="m"} %d\n' % i for i in range(200))
ACCEPT = {"Accept": "text/plain;version=0.0.4"}
SAME_IDS = ["length", "chunked", "small-chunks", "close", "http1.0", "gzip", "deflate",
            "gzip-chunked", "interim-100", "empty"]  # fmt: skip
Answer = Callable[[int], bytes | None]  # the n-th request on a connection -> raw bytes


def sized(body: bytes, status: int = 200, extra: str = "") -> bytes:
    head = f"HTTP/1.1 {status} X\r\nContent-Length: {len(body)}\r\n{extra}\r\n"
    return head.encode() + body


def chunked(body: bytes, size: int = 1000, extra: str = "") -> bytes:
    parts = [f"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n{extra}\r\n".encode()]
    for i in range(0, len(body), size):
        piece = body[i : i + size]
        parts.append(f"{len(piece):x};ext=1\r\n".encode() + piece + b"\r\n")
    return b"".join(parts) + b"0\r\nX-Trailer: t\r\n\r\n"


class RawServer:
    """Answers the n-th request of each connection with ``answer(n)``'s raw bytes; None
    closes the connection without answering.  Counts connections, keeps request heads."""

    def __init__(self, answer: Answer, tls: ssl.SSLContext | None = None) -> None:
        self.answer, self.tls = answer, tls
        self.connections = 0
        self.heads: list[bytes] = []
        self.writers: set[asyncio.StreamWriter] = set()

    async def __aenter__(self) -> RawServer:
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", 0, ssl=self.tls)
        port = self.server.sockets[0].getsockname()[1]
        self.url = f"{'https' if self.tls else 'http'}://127.0.0.1:{port}/metrics"
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.server.close()
        for writer in self.writers:
            writer.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self.writers.add(writer)
        with contextlib.suppress(Exception):
            for n in range(1_000):
                self.heads.append(await reader.readuntil(b"\r\n\r\n"))
                raw = self.answer(n)
                if raw is None:
                    break
                writer.write(raw)
                await writer.drain()
                head = raw.split(b"\r\n\r\n")[0]
                framed = b"Content-Length" in head or b"chunked" in head
                if b"Connection: close" in head or not framed:
                    break  # a body that ends where the connection does
        writer.close()


async def ours(url: str, limit: int = 2**20, **kw: object) -> bytes:
    client = HttpClient(ssl.create_default_context(), ACCEPT)
    try:
        async with Deadline(30):
            return await client.get(url, limit, **kw)  # type: ignore[arg-type]
    finally:
        await client.aclose()


async def theirs(url: str, **kw: object) -> bytes:
    async with httpx.AsyncClient(headers=ACCEPT) as client:
        r = await client.get(url, timeout=30, **kw)  # type: ignore[arg-type]
        r.raise_for_status()
        return r.content


def both(answer: Answer, **kw: object) -> tuple[bytes, bytes]:
    async def run() -> tuple[bytes, bytes]:
        async with RawServer(answer) as server:
            return await ours(server.url, **kw), await theirs(server.url)

    return asyncio.run(run())


@pytest.mark.parametrize(
    "raw",
    [
        sized(PAGE),
        chunked(PAGE),
        chunked(PAGE, size=7),
        b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n" + PAGE,  # ends where it closes
        b"HTTP/1.0 200 OK\r\n\r\n" + PAGE,
        sized(gzip.compress(PAGE), extra="Content-Encoding: gzip\r\n"),
        sized(zlib.compress(PAGE), extra="Content-Encoding: deflate\r\n"),
        chunked(gzip.compress(PAGE), size=100, extra="Content-Encoding: gzip\r\n"),
        b"HTTP/1.1 100 Continue\r\n\r\n" + sized(PAGE),
        sized(b""),
    ],
    ids=SAME_IDS,
)
def test_same_body_as_httpx(raw: bytes) -> None:
    mine, httpx_body = both(lambda n: raw)
    assert mine == httpx_body


def test_headers_and_federate_params_as_httpx_sends_them() -> None:
    params = [("match[]", '{__name__=~"DCGM_FI_.*|up"}'), ("match[]", "vllm:x_bucket")]

    async def run() -> list[bytes]:
        async with RawServer(lambda n: sized(PAGE)) as server:
            await ours(server.url + "?a=1", params=params)
            await theirs(server.url + "?a=1", params=params)
            return server.heads

    mine, httpx_head = (h.decode().split("\r\n") for h in asyncio.run(run()))
    # the URL's own query is kept (httpx replaced it with the params)
    assert parse_qsl(urlsplit(mine[0].split()[1]).query) == [("a", "1"), *params]
    assert parse_qsl(urlsplit(httpx_head[0].split()[1]).query) == params
    assert "Accept: text/plain;version=0.0.4" in mine
    assert next(h for h in mine if h.startswith("Host:")) == next(
        h for h in httpx_head if h.startswith("Host:")
    )


def test_basic_auth_and_odd_paths_as_httpx_sends_them() -> None:
    async def run() -> list[bytes]:
        async with RawServer(lambda n: sized(PAGE)) as server:
            url = server.url.replace("http://", "http://us%40er:p%3Ass@") + "/a b/ü"
            await ours(url)
            await theirs(url)
            return server.heads

    mine, httpx_head = (h.decode().split("\r\n") for h in asyncio.run(run()))
    assert mine[0] == httpx_head[0]  # the request line: the path quoted alike
    auth = [h for h in mine if h.startswith("Authorization:")]
    assert auth and auth == [h for h in httpx_head if h.startswith("Authorization:")]


@pytest.mark.parametrize("status", [404, 500, 503])
def test_a_status_other_than_200_is_a_page_error(status: int) -> None:
    async def run() -> None:
        async with RawServer(lambda n: sized(b"oops", status)) as server:
            with pytest.raises(PageError, match=f"HTTP {status}") as err:
                await ours(server.url)
            assert err.value.reason == "http_status"
            with pytest.raises(httpx.HTTPStatusError):
                await theirs(server.url)

    asyncio.run(run())


@pytest.mark.parametrize(
    "raw",
    [
        sized(PAGE),
        chunked(PAGE),
        b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n" + PAGE,
        sized(gzip.compress(PAGE), extra="Content-Encoding: gzip\r\n"),
        # a length the target never sends: refused from the head, before any body is read
        b"HTTP/1.1 200 OK\r\nContent-Length: 100000000000\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nffffffffff\r\n",
    ],
    ids=["length", "chunked", "close", "gzip", "huge-length", "huge-chunk"],
)
def test_a_page_over_the_limit_is_refused(raw: bytes) -> None:
    async def run() -> None:
        async with RawServer(lambda n: raw) as server:
            with pytest.raises(PageError, match="larger than 1000 bytes") as err:
                await ours(server.url, limit=1000)
            assert err.value.reason == "page_too_large"

    asyncio.run(run())


@pytest.mark.parametrize(
    "raw",
    [
        b"HTTP/1.1 200 OK\r\nContent-Length: 5000\r\n\r\n" + PAGE[:100],
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3e8\r\n" + PAGE[:100],
        b"HTTP/1.1 200 OK\r\nContent-Len",
        b"",
        b"SSH-2.0-OpenSSH_9.6\r\n\r\n",
        sized(b"not gzip at all", extra="Content-Encoding: gzip\r\n"),
    ],
    ids=["short-length", "short-chunk", "short-head", "nothing", "not-http", "bad-gzip"],
)
def test_a_target_that_breaks_off_is_an_error_as_with_httpx(raw: bytes) -> None:
    """The target writes ``raw`` and closes the connection."""

    class Closing(RawServer):
        async def _handle(self, reader: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            await reader.readuntil(b"\r\n\r\n")
            w.write(raw)
            await w.drain()
            w.close()

    async def run_closing() -> None:
        async with Closing(lambda n: None) as server:
            with pytest.raises(FetchError):
                await ours(server.url)
            with pytest.raises(httpx.HTTPError):
                await theirs(server.url)

    asyncio.run(run_closing())


def test_one_connection_is_kept_and_replaced_when_the_target_drops_it() -> None:
    async def run() -> int:
        # the 3rd request on a connection finds it closed unanswered (a keep-alive timeout
        # racing our request): the GET goes once more, on a new connection
        async with RawServer(lambda n: None if n == 2 else sized(PAGE)) as server:
            client = HttpClient(ssl.create_default_context(), ACCEPT)
            for _ in range(4):
                assert await client.get(server.url, 2**20) == PAGE
            await client.aclose()
            return server.connections

    assert asyncio.run(run()) == 2


def test_a_connection_close_answer_is_not_reused() -> None:
    async def run() -> int:
        async with RawServer(lambda n: sized(PAGE, extra="Connection: close\r\n")) as server:
            client = HttpClient(ssl.create_default_context(), ACCEPT)
            for _ in range(3):
                assert await client.get(server.url, 2**20) == PAGE
            await client.aclose()
            return server.connections

    assert asyncio.run(run()) == 3


def test_refused_connection_is_a_fetch_error() -> None:
    async def run() -> None:
        async with RawServer(lambda n: None) as server:
            url = server.url
        with pytest.raises(FetchError, match="ConnectError"):
            await ours(url)

    asyncio.run(run())


def test_a_trickled_answer_ends_at_the_deadline() -> None:
    class Trickle(RawServer):
        async def _handle(self, reader: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            with contextlib.suppress(Exception):
                await reader.readuntil(b"\r\n\r\n")
                w.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100000000\r\n\r\n")
                for _ in range(1_000):
                    w.write(PAGE[:40])
                    await w.drain()
                    await asyncio.sleep(0.02)
            w.close()

    async def run() -> None:
        async with Trickle(lambda n: None) as server:
            client = HttpClient(ssl.create_default_context(), ACCEPT)
            with pytest.raises(TimeoutError):
                async with Deadline(0.5):
                    await client.get(server.url, 2**30)
            await client.aclose()

    asyncio.run(run())


def test_deadline_leaves_an_outer_cancel_alone() -> None:
    """A cancel from outside (the collector stopping) is not turned into a timeout."""

    async def run() -> None:
        async def scrape() -> None:
            async with Deadline(30):
                await asyncio.sleep(60)

        task = asyncio.create_task(scrape())
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(run())


def test_tls_verifies_with_the_given_context(certificate: tuple[Path, Path]) -> None:
    cert, key = certificate
    server_tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_tls.load_cert_chain(cert, key)

    async def run() -> None:
        async with RawServer(lambda n: sized(PAGE), tls=server_tls) as server:
            trusting = HttpClient(ssl.create_default_context(cafile=str(cert)), ACCEPT)
            for _ in range(2):
                assert await trusting.get(server.url, 2**20) == PAGE
            await trusting.aclose()
            assert server.connections == 1
            with pytest.raises(FetchError, match="CERTIFICATE_VERIFY_FAILED"):
                await ours(server.url)  # the default CAs do not know this certificate

    asyncio.run(run())
