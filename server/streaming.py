"""Server-sent events and client-disconnect handling.

`EventStreamResponse` sends an async iterator of already formatted SSE text and calls
`on_disconnect` the moment the client goes away (not only at the next write), so a generation
is cancelled at its next token even while nothing is being sent (a long prefill, a queue
wait). `unless_disconnected` runs an awaitable but gives up, raising `ClientDisconnected`, if
the client disconnects first (non-streaming requests, waiting for a slot).
"""
from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any, AsyncIterator, Awaitable, Callable, Mapping, TypeVar

from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

__all__ = ["EventStreamResponse", "ClientDisconnected", "unless_disconnected", "sse", "sse_event"]

T = TypeVar("T")


class ClientDisconnected(Exception):
    """The client closed the connection before the answer was ready."""


def sse(data: Any) -> str:
    """One ``data:`` event (a JSON value, or a string sent as is)."""
    text = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    return f"data: {text}\n\n"


def sse_event(event: str, data: Any) -> str:
    """A named event (``event:`` + ``data:``), as the Anthropic and Responses APIs use."""
    return f"event: {event}\n" + sse(data)


async def _until_disconnect(receive: Receive) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return


async def unless_disconnected(request: Request, awaitable: Awaitable[T]) -> T:
    """Await `awaitable` unless the client disconnects first (then cancel it and raise
    ClientDisconnected). The request body must already have been read."""
    task = asyncio.ensure_future(awaitable)
    watcher = asyncio.ensure_future(_until_disconnect(request.receive))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            return task.result()
        raise ClientDisconnected()
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()
            with contextlib.suppress(BaseException):
                await task


class EventStreamResponse(Response):
    """A ``text/event-stream`` response over `body` (SSE text pieces).

    on_disconnect() is called once if the client goes away before the end; on_close() is
    always called when the response ends, however it ends."""

    media_type = "text/event-stream"

    def __init__(self, body: AsyncIterator[str], *, on_disconnect: Callable[[], None] | None = None,
                 on_close: Callable[[], None] | None = None, headers: Mapping[str, str] | None = None) -> None:
        # Not Response.__init__: it would declare a Content-Length for an empty body.
        self.status_code = 200
        self.background = None
        self.init_headers({"Cache-Control": "no-cache", "X-Accel-Buffering": "no", **(headers or {})})
        self._body = body
        self._on_disconnect = on_disconnect
        self._on_close = on_close
        self._gone = False

    def _disconnected(self) -> None:
        if not self._gone:
            self._gone = True
            if self._on_disconnect is not None:
                self._on_disconnect()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def watch() -> None:
            await _until_disconnect(receive)
            self._disconnected()

        watcher = asyncio.ensure_future(watch())
        try:
            await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
            async for piece in self._body:
                if self._gone:
                    break
                await send({"type": "http.response.body", "body": piece.encode("utf-8"), "more_body": True})
            if not self._gone:
                await send({"type": "http.response.body", "body": b"", "more_body": False})
        except OSError:  # the socket went away mid-write
            self._disconnected()
        finally:
            watcher.cancel()
            with contextlib.suppress(BaseException):
                await self._body.aclose()  # type: ignore[attr-defined]
            if self._on_close is not None:
                self._on_close()
