"""A TCP forwarder that records the ONC RPC records passing through it, both ways: put between
the guest's NFS client and a gateway, it captures what the Linux client sends and what we
answer, record by record (``tests/e2e/capture_golden.py`` writes golden bytes from it).

Owns: a listening socket on 127.0.0.1, two threads per connection copying bytes unchanged
and a ``RecordReader`` per direction. Must not: change, delay or reorder a byte; know any
procedure (``Capture`` pairs calls and replies by xid only).
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from types import TracebackType

from nfsproto import rpc

__all__ = ["Capture", "RecordingForwarder"]


@dataclass(slots=True)
class Capture:
    """Records in arrival order: ``(connection number, "call" | "reply", record)``."""

    records: list[tuple[int, str, bytes]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, conn: int, direction: str, record: bytes) -> None:
        with self.lock:
            self.records.append((conn, direction, record))

    def exchanges(self) -> list[tuple[bytes, bytes | None]]:
        """(call, its reply or None) in call order, paired by connection and xid."""
        with self.lock:
            recs = list(self.records)
        replies: dict[tuple[int, int | None], bytes] = {}
        for conn, d, rec in recs:
            if d == "reply":
                replies.setdefault((conn, rpc.peek_xid(rec)), rec)
        return [
            (rec, replies.get((conn, rpc.peek_xid(rec)))) for conn, d, rec in recs if d == "call"
        ]


class RecordingForwarder:
    """``with RecordingForwarder(upstream_port) as fwd:`` point clients at ``fwd.port``;
    ``fwd.capture`` holds what passed."""

    def __init__(self, upstream_port: int, upstream_host: str = "127.0.0.1") -> None:
        self.upstream = (upstream_host, upstream_port)
        self.capture = Capture()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._threads: list[threading.Thread] = []
        self._socks: list[socket.socket] = []
        self._closed = False
        self._spawn(self._accept_loop, "fwd-accept")

    def _spawn(self, target: Callable[..., None], name: str, *args: object) -> None:
        t = threading.Thread(target=target, args=args, name=name, daemon=True)
        self._threads.append(t)
        t.start()

    def _accept_loop(self) -> None:
        n = 0
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self.upstream, timeout=10)
            except OSError:
                client.close()
                continue
            server.settimeout(None)
            self._socks += [client, server]
            self._spawn(self._pump, f"fwd-{n}-call", n, "call", client, server)
            self._spawn(self._pump, f"fwd-{n}-reply", n, "reply", server, client)
            n += 1

    def _pump(self, conn: int, direction: str, src: socket.socket, dst: socket.socket) -> None:
        records = rpc.RecordReader(64 << 20)
        try:
            while data := src.recv(1 << 20):
                dst.sendall(data)
                for rec in records.feed(data):
                    self.capture.add(conn, direction, bytes(rec))
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                dst.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        self._closed = True
        for s in [self._listener, *self._socks]:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)  # wakes the threads blocked in accept/recv
            s.close()
        for t in self._threads:
            t.join(5)

    def __enter__(self) -> RecordingForwarder:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
