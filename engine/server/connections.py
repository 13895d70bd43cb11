"""How long a connection may keep the server waiting, and the uvicorn set-up that enforces it.

uvicorn times out a connection only between two requests (`timeout_keep_alive`, from the end of a
reply): one that is opened and never speaks, or that sends its headers a byte at a time, is held for
ever. `TimedH11Protocol` (uvicorn's h11 protocol, the one it runs without httptools) closes a connection
whose request headers are not complete HEADER_TIMEOUT_S after it opened or after its first byte
following a reply. Headers are bounded in size by h11 (16 KiB); the body, in size and in time, by
engine.server.body.
"""

from __future__ import annotations

import asyncio

import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

HEADER_TIMEOUT_S = 20.0
KEEP_ALIVE_S = 5  # idle between two requests on one connection (uvicorn's default)


class TimedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol, with a deadline on each request's headers."""

    header_timeout_s = HEADER_TIMEOUT_S

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._header_deadline: asyncio.TimerHandle | None = None
        super().connection_made(transport)
        self._arm_header_deadline()

    def data_received(self, data: bytes) -> None:
        cycle = self.cycle
        super().data_received(data)
        if self.cycle is not cycle:  # a request's headers are complete: the app has it now
            self._disarm_header_deadline()
        elif self._header_deadline is None and self._between_requests():
            self._arm_header_deadline()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_header_deadline()
        super().connection_lost(exc)

    def _between_requests(self) -> bool:
        return self.cycle is None or self.cycle.response_complete

    def _arm_header_deadline(self) -> None:
        self._header_deadline = self.loop.call_later(self.header_timeout_s, self._headers_too_late)

    def _disarm_header_deadline(self) -> None:
        if self._header_deadline is not None:
            self._header_deadline.cancel()
            self._header_deadline = None

    def _headers_too_late(self) -> None:
        self._header_deadline = None
        if self._between_requests() and not self.transport.is_closing():
            self.transport.close()


def server_config(app, *, header_timeout_s: float = HEADER_TIMEOUT_S, **options) -> uvicorn.Config:
    """uvicorn's Config for `app` with Tandem's connection timeouts; `options` go to uvicorn.Config."""
    protocol = type("TimedH11Protocol", (TimedH11Protocol,), {"header_timeout_s": header_timeout_s})
    options.setdefault("timeout_keep_alive", KEEP_ALIVE_S)
    return uvicorn.Config(app, http=protocol, **options)
