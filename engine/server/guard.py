"""Who may drive the server: checks in front of every route, and the count of every error answered.

A web page in the user's browser can send requests to 127.0.0.1, and a page on a name that an
attacker points at 127.0.0.1 (DNS rebinding) can even read the answers. So, before any route runs:
  - Host: it must be a valid host[:port] (400 otherwise: `127.0.0.1:evil.com` names no port, and a
    lenient reading would serve it as 127.0.0.1); without an API key, only the bound address,
    `localhost`, a loopback address or a name given with --allow-host is served (a rebinding page
    sends its own name), and a request that names no host at all (HTTP/1.0 allows it) is refused;
  - Origin: a browser request from another origin is refused unless --cors-origin names that origin;
    the origins it names get CORS headers and their preflights answered (starlette's CORSMiddleware,
    inside this one).
The third lock, JSON bodies only (no cross-origin page can send JSON without a preflight), is in
engine.server.body. Refusals are OpenAI-style error objects with status 403 (400 for a malformed Host).
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable
from urllib.parse import urlsplit

from starlette.datastructures import Headers
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from engine.errors import SettingsError
from engine.server.listen import is_loopback
from engine.server.metrics import ServerMetrics
from engine.server.schemas import ApiError

CLIENT_GONE = 499  # answered to a client that left; counted on request_total, not as an error
# RFC 3986's host (a bracketed IPv6 address, or a name or IPv4 address of letters, digits, '.', '-'
# and '_'), then an optional port
_HOST_HEADER = re.compile(
    r"(?:\[(?P<ipv6>[0-9a-fA-F:.]+)\]|(?P<name>[A-Za-z0-9_][A-Za-z0-9._-]*))(?::(?P<port>[0-9]{0,5}))?"
)


def parsed_host(host_header: str) -> str | None:
    """The host a Host header names, as host_name gives it, or None when the header is not a valid
    host[:port]: '127.0.0.1:evil.com', '[::1]evil.com', '' and the like."""
    found = _HOST_HEADER.fullmatch(host_header.strip())
    if found is None or (found["port"] and int(found["port"]) > 65535):
        return None
    if found["ipv6"] is not None:
        try:
            return ipaddress.IPv6Address(found["ipv6"]).compressed
        except ValueError:
            return None
    name = found["name"].lower().rstrip(".")
    return name or None


def host_name(host_header: str) -> str:
    """'127.0.0.1:8000' -> '127.0.0.1', '[::1]:8000' -> '::1', 'LocalHost.' -> 'localhost'; lenient, for
    the names the server is told to serve (a Host header is read by parsed_host)."""
    host = host_header.strip().lower()
    if host.startswith("["):
        host = host[1 : host.find("]")] if "]" in host else host[1:]
    elif host.count(":") == 1:
        host = host.split(":")[0]
    return host.rstrip(".")


def checked_origin(origin: str) -> str:
    """A --cors-origin value as browsers send it in `Origin` (scheme://host[:port]); SettingsError else."""
    parts = urlsplit(origin.strip())
    if parts.scheme not in ("http", "https") or not parts.netloc or parts.path not in ("", "/"):
        raise SettingsError(
            f"--cors-origin takes a web page's origin, such as http://localhost:3000, not '{origin}'."
        )
    if parts.query or parts.fragment or "@" in parts.netloc:
        raise SettingsError(f"--cors-origin takes scheme://host[:port] only, not '{origin}'.")
    return f"{parts.scheme}://{parts.netloc.lower()}"


class RequestGuard:
    """ASGI middleware: refuses foreign hosts and origins, and counts error answers on /metrics.

    `allowed_hosts`: names served besides loopback addresses; None serves any name (an API key is set,
    and it is what keeps strangers out)."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        metrics: ServerMetrics,
        allowed_hosts: Iterable[str] | None,
        cors_origins: Iterable[str] = (),
    ):
        self.app = app
        self.metrics = metrics
        self.allowed_hosts = None if allowed_hosts is None else {host_name(h) for h in allowed_hosts}
        self.cors_origins = set(cors_origins)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def counted(message: Message) -> None:
            if message["type"] == "http.response.start" and 400 <= message["status"] != CLIENT_GONE:
                self.metrics.count_error(message["status"])
            await send(message)

        refusal = self.refusal(scope)
        if refusal is not None:
            await JSONResponse(refusal.body(), status_code=refusal.status)(scope, receive, counted)
            return
        await self.app(scope, receive, counted)

    def refusal(self, scope: Scope) -> ApiError | None:
        headers = Headers(scope=scope)
        host = headers.get("host")
        name = None if host is None else parsed_host(host)
        if host is not None and name is None:
            return ApiError(
                400,
                f"The Host header '{host[:100]}' is not a valid host name or address with an optional port.",
                code="invalid_host",
            )
        if host is None and self.allowed_hosts is not None:
            return ApiError(
                403,
                f"This server answers only requests that name it in a Host header "
                f"({self._served_names()}). Send one, as HTTP/1.1 requires, or start the server with an "
                "API key.",
                "permission_error",
                code="host_not_allowed",
            )
        served = self.allowed_hosts is None or name is None or name in self.allowed_hosts
        if not served and not is_loopback(name):
            return ApiError(
                403,
                f"This server answers only to {self._served_names()}, not to '{name}'. Start it "
                f"with --allow-host {name} to serve that name too, or with an API key.",
                "permission_error",
                code="host_not_allowed",
            )
        origin = headers.get("origin")
        if origin is not None and origin not in self.cors_origins and origin != f"{scope['scheme']}://{host}":
            try:
                advice = (
                    f" Start the server with --cors-origin {checked_origin(origin)} if that page may use it."
                )
            except SettingsError:  # "null" (a sandboxed page, a file) and the like: no origin to allow
                advice = ""
            return ApiError(
                403,
                f"Requests from web pages at {origin} are refused.{advice}",
                "permission_error",
                code="origin_not_allowed",
            )
        return None

    def _served_names(self) -> str:
        names = sorted(self.allowed_hosts - {"localhost"})
        return ", ".join(["localhost", *names]) + " and loopback addresses"
