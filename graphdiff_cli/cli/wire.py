"""The wire between ``graphdiff`` clients and ``graphdiff serve``, standard library only: where a STATE's server
listens, and one length-prefixed JSON message each way."""

from __future__ import annotations

import json
import socket
import struct
from pathlib import Path

CONNECT_TIMEOUT = 2.0
MAX_MESSAGE = 1 << 30


def socket_path(state) -> Path:
    """Where ``graphdiff serve --state S`` listens: ``S.sock`` beside the STATE directory."""
    state = Path(state)
    return state.parent / f"{state.name}.sock"


def forwarded(key: str) -> bool:
    """An environment variable a forwarded command sees as the client's: graphdiff's own and the output ones."""
    return key.startswith("GRAPHDIFF_") or key in ("NO_COLOR", "COLUMNS")


def connect(path) -> socket.socket | None:
    """A connection to the server listening on ``path``, or None when none answers (a stale socket)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(CONNECT_TIMEOUT)
    try:
        sock.connect(str(path))
    except OSError:
        sock.close()
        return None
    sock.settimeout(None)
    return sock


def send_message(sock: socket.socket, obj: dict) -> None:
    data = json.dumps(obj).encode()
    sock.sendall(struct.pack(">Q", len(data)) + data)


def recv_message(sock: socket.socket) -> dict | None:
    """One length-prefixed JSON object, or None when the peer closed the connection first."""
    head = _recv_exact(sock, 8)
    if head is None:
        return None
    (size,) = struct.unpack(">Q", head)
    if size > MAX_MESSAGE:
        raise ValueError(f"a message of {size} bytes")
    body = _recv_exact(sock, size)
    return None if body is None else json.loads(body)


def _recv_exact(sock: socket.socket, size: int) -> bytes | None:
    chunks, left = [], size
    while left:
        chunk = sock.recv(min(left, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)
