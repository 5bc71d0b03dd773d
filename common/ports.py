"""Is a TCP port taken? Checked before a command starts a server on it, so a clash is one clear line."""

from __future__ import annotations

import socket


def port_in_use(port: int, host: str = "127.0.0.1") -> bool:
    """True when something accepts connections on host:port (a bare TCP connect: nothing is sent)."""
    with socket.socket() as sock:
        sock.settimeout(1.0)
        return sock.connect_ex((host, port)) == 0


def port_free(host: str, port: int) -> bool:
    """Whether a server could listen on host:port now (with SO_REUSEADDR, as uvicorn sets it, so a closing
    socket in TIME_WAIT does not count as taken)."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def looks_like_path(model: str) -> bool:
    """A hub id is `name` or `org/name`; a model named like a path (or with more slashes) is a folder."""
    return model.startswith(("/", ".", "~")) or model.count("/") > 1
