"""A TCP relay on loopback that a test can cut: the network path between a sandbox worker and
its control plane, so that a test can partition them without touching the host's firewall.

`cut()` is a partition, not a hang-up: every connection stays open and everything sent into it
is silently dropped both ways (as a pulled cable or a blackholing firewall rule), and new
connections are accepted and then blackholed too. Neither end learns of it but by silence: a
worker must notice from its unacknowledged heartbeats, a control plane from the missing ones.
`restore()` lets new connections through (the cut ones stay dead, as after a real partition
their TCP state would have timed out)."""

from __future__ import annotations

import contextlib
import selectors
import socket
import threading

__all__ = ["Relay"]


class Relay:
    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self.address = f"127.0.0.1:{self.port}"
        self._cut = threading.Event()
        self._closed = threading.Event()
        self._lock = threading.Lock()
        self._pairs: list[tuple[socket.socket, socket.socket, bool]] = []  # (a, b, dead)
        self._threads = [threading.Thread(target=self._accept, daemon=True, name="relay-accept")]
        self._threads[0].start()

    def cut(self) -> None:
        """Drop everything from now on, both ways, on every connection, old and new."""
        with self._lock:
            self._cut.set()
            self._pairs = [(a, b, True) for a, b, _ in self._pairs]

    def restore(self) -> None:
        """New connections pass again (the cut ones stay blackholed)."""
        self._cut.clear()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            dead = self._cut.is_set()
            try:
                upstream = socket.create_connection(self.target) if not dead else socket.socket()
            except OSError:
                client.close()
                continue
            with self._lock:
                self._pairs.append((client, upstream, dead))
                index = len(self._pairs) - 1
            t = threading.Thread(target=self._pump, args=(index,), daemon=True, name="relay-pump")
            t.start()
            self._threads.append(t)

    def _pump(self, index: int) -> None:
        with self._lock:
            a, b, born_dead = self._pairs[index]
        sel = selectors.DefaultSelector()
        sel.register(a, selectors.EVENT_READ, b)
        if not born_dead:  # a connection accepted while cut has no upstream: only its client is read
            sel.register(b, selectors.EVENT_READ, a)
        try:
            while not self._closed.is_set() and sel.get_map():
                for key, _ in sel.select(0.2):
                    src = key.fileobj
                    dst = key.data
                    with self._lock:
                        dead = self._pairs[index][2]
                    try:
                        data = src.recv(65536)  # type: ignore[union-attr]
                    except OSError:
                        data = b""
                    if not data:
                        if not dead:
                            return  # a real hang-up passes through: both ends close
                        # Cut: the other end never hears of it (no FIN crosses a partition).
                        sel.unregister(src)
                        continue
                    if not dead:
                        try:
                            dst.sendall(data)
                        except OSError:
                            return
        finally:
            sel.close()
            if not self._closed.is_set():
                with self._lock:
                    dead = self._pairs[index][2]
                if dead:
                    # Held open until the relay closes, silent: as the far end of a partition.
                    self._closed.wait()
            for s in (a, b):
                with contextlib.suppress(OSError):
                    s.close()

    def close(self) -> None:
        self._closed.set()
        self._listener.close()
        with self._lock:
            pairs = list(self._pairs)
        for a, b, _ in pairs:
            for s in (a, b):
                with contextlib.suppress(OSError):
                    s.close()
        for t in self._threads:
            t.join(5)
