"""Where the server listens: a socket bound before the model loads (so a taken port fails fast), and
the rule that any address off this computer needs an API key."""

from __future__ import annotations

import ipaddress
import socket

from engine.errors import SettingsError


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_bind(host: str, api_key: str | None) -> None:
    if not is_loopback(host) and not api_key:
        raise SettingsError(
            f"Serving on {host} opens the engine to other computers: give an API key with --api-key "
            "or --api-key-env, or bind 127.0.0.1."
        )


def bind_socket(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as error:
        sock.close()
        raise SettingsError(f"Cannot listen on {host}:{port}: {error.strerror or error}.") from None
    sock.listen(128)
    sock.set_inheritable(True)
    return sock
