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
