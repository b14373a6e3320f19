"""The simulated fleet served in-process: an httpx transport instead of loopback sockets.

``hbmwatch eval`` steps the fleet and the collector in lockstep, so every scrape would
otherwise pay a loopback connection, an asyncio stream server and HTTP framing on both
sides, for a page rendered in the same process; on a 2-core machine that was most of a
simulated day's cost.  ``InProcessServer`` answers the same paths with the same pages and
statuses as ``SimServer`` (it is one: only the sockets are gone), and ``transport()`` hands
the collector an ``httpx.AsyncBaseTransport`` that routes each request to it.  The
collector keeps everything else: its httpx client, fetch, page limits, parse and translate.
"""

from __future__ import annotations

import httpx

from hbmwatch.simulator.server import SimServer, Target

#: Made-up ports: a target's URL names its node as over HTTP, but nothing listens there.
FIRST_PORT = 20_000


class InProcessServer(SimServer):
    """``SimServer``'s routes and pages, answered without a socket."""

    async def start(self) -> list[Target]:
        fleet = self.sim.fleet
        base = self.base_port or FIRST_PORT
        for node in fleet.nodes:
            self.ports.append(base + node.index)
            self._routes.append(self.routes_of(node.index))
        return self.targets()

    async def close(self) -> None:
        """Nothing listens, so nothing to close."""

    def answer(self, port: int | None, path: str) -> tuple[int, bytes, str]:
        """Status, body and content type for ``path`` on the node served at ``port``."""
        try:
            routes = self._routes[self.ports.index(port or 0)]
        except ValueError:
            return 404, f"no simulated node on port {port}\n".encode(), "text/plain"
        return self._route(path, routes)

    def transport(self) -> httpx.AsyncBaseTransport:
        return SimTransport(self)


class SimTransport(httpx.AsyncBaseTransport):
    """Routes each request to an ``InProcessServer`` (GET and HEAD, as ``SimServer``)."""

    def __init__(self, server: InProcessServer) -> None:
        self._server = server

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if request.method not in ("GET", "HEAD"):
            return httpx.Response(405, content=b"only GET is served\n", request=request)
        status, body, ctype = self._server.answer(request.url.port, request.url.path)
        content = b"" if request.method == "HEAD" else body
        return httpx.Response(
            status, headers={"Content-Type": ctype}, content=content, request=request
        )
