"""A deadline on request bodies for every HTTP listener (central's REST API and gateway,
an edge's HTTP API), as plain ASGI so both deployables wrap their app in it.

A client that announces a body and sends it a few bytes at a time holds whatever the
request holds (a gateway or edge slot, a push slot, a socket) for as long as it likes;
uvicorn's idle timeout (``timeout_keep_alive``) only runs between requests. Here the
whole body must arrive within ``timeout_s`` of the request's headers (``idle_only``
requests, such as model pushes of many GiB, instead get ``timeout_s`` between two
pieces). Past it the client gets **408** ``{"error": …}`` with ``Connection: close`` (so
uvicorn closes the socket), and the application sees the client as gone
(``http.disconnect``): it drops the request and gives back what it held. Whatever the
application sends after that is dropped."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

__all__ = ["BodyDeadline"]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]

_DISCONNECT: Message = {"type": "http.disconnect"}


class BodyDeadline:
    """ASGI middleware: a request body not received within ``timeout_s`` is a 408 that
    closes the connection (see the module doc); ``idle_only(scope)`` picks the requests
    whose pieces, not whole body, get ``timeout_s`` each."""

    def __init__(self, app: App, timeout_s: float, idle_only: Callable[[Scope], bool] | None = None) -> None:
        if timeout_s <= 0:
            raise ValueError("the body timeout must be positive")
        self.app = app
        self.timeout_s = timeout_s
        self._idle_only = idle_only
        #: Requests answered 408 since start.
        self.timed_out = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        await _Exchange(self, scope, receive, send).run()


class _Exchange:
    """One request under a :class:`BodyDeadline`."""

    def __init__(self, limit: BodyDeadline, scope: Scope, receive: Receive, send: Send) -> None:
        self._limit = limit
        self._scope = scope
        self._receive = receive
        self._send = send
        self._idle_only = limit._idle_only is not None and limit._idle_only(scope)
        self._deadline = asyncio.get_running_loop().time() + limit.timeout_s
        self._body_done = False
        self._started = False  # the application began its answer
        self._expired = False  # the 408 went out: nothing more from the application

    async def run(self) -> None:
        await self._limit.app(self._scope, self.receive, self.send)

    async def receive(self) -> Message:
        if self._expired:
            return _DISCONNECT
        if self._body_done:  # waiting for a disconnect after the body is not the body's time
            return await self._receive()
        loop = asyncio.get_running_loop()
        if self._idle_only:
            self._deadline = loop.time() + self._limit.timeout_s
        try:
            async with asyncio.timeout_at(self._deadline):
                message = await self._receive()
        except TimeoutError:
            await self._expire()
            return _DISCONNECT
        if message["type"] != "http.request" or not message.get("more_body", False):
            self._body_done = True
        return message

    async def send(self, message: Message) -> None:
        if self._expired:
            return
        if message["type"] == "http.response.start":
            self._started = True
        await self._send(message)

    async def _expire(self) -> None:
        if self._started:  # the application answered already (a 413, say): nothing to add
            return
        self._expired = True
        self._limit.timed_out += 1
        what = "between two pieces of" if self._idle_only else "for the whole of"
        body = json.dumps(
            {"error": f"request body not received in time ({self._limit.timeout_s:g}s {what} it); closing"}
        ).encode()
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"connection", b"close"),
        ]
        await self._send({"type": "http.response.start", "status": 408, "headers": headers})
        await self._send({"type": "http.response.body", "body": body, "more_body": False})
