"""One call's output: the engine's attach socket, its demultiplexing, and the capped streams.

The call's stdin is written through the attach socket and stdout and stderr are read from the
same socket, each kept up to its byte cap; PID 1's own report lines are taken out of stdout on
the way (ringfence_server.sandbox.witness). `pump` returns why the container must be killed (the deadline, a
cap), so the wall time is enforced by the engine's kill, never by killing a client process
(which would leave the tool's `setsid` children alive).
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import logging
import select
import socket
import struct
import time
from dataclasses import dataclass

import docker
from docker.models.containers import Container

from ringfence_server.sandbox.backend import OutputListener
from ringfence_server.sandbox.engine import container_id
from ringfence_server.sandbox.pool import AttachStream, Demux
from ringfence_server.sandbox.result import Outcome
from ringfence_server.sandbox.witness import InitWitness

log = logging.getLogger("ringfence.sandbox.docker")

# The stream numbers of Docker's multiplexed attach frames.
STDOUT, STDERR = 1, 2


@dataclass
class CappedStreams:
    """Output read so far, capped. PID 1's own lines are taken out of stdout first (tini writes
    its reports there; they are not the tool's output and do not count against its cap)."""

    stdout_limit: int
    stderr_limit: int
    stdout: bytearray
    stderr: bytearray
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    witness: InitWitness = dataclasses.field(default_factory=InitWitness)
    on_output: OutputListener | None = None
    """Told each piece kept, as it is kept (SandboxRequest.on_output); dropped after it raises."""

    def add(self, stream: int, data: bytes) -> bool:
        """Keep what fits; return True when a cap was exceeded."""
        if stream == STDERR:
            self._keep("stderr", data)
        else:
            self._keep("stdout", self.witness.feed(data))
        return self.stdout_truncated or self.stderr_truncated

    def finish(self) -> None:
        """The container is gone: what the witness still held back is the tool's stdout."""
        self._keep("stdout", self.witness.finish())

    def _keep(self, name: str, data: bytes) -> None:
        """Append what fits under the stream's cap (the rest marks it truncated), and tell."""
        stderr = name == "stderr"
        kept_so_far, limit = (self.stderr, self.stderr_limit) if stderr else (self.stdout, self.stdout_limit)
        room = limit - len(kept_so_far)
        kept = data[: max(room, 0)]
        kept_so_far += kept  # the bytearray itself grows
        if len(data) > room:
            if stderr:
                self.stderr_truncated = True
            else:
                self.stdout_truncated = True
        self._tell(name, kept)

    def _tell(self, name: str, kept: bytes) -> None:
        """Pass exactly the kept bytes on. The listener runs on the call's reading thread: one
        that raises is the caller's bug, and must not end (or misclassify) the call, so it is
        logged once and not called again; the result still holds every byte."""
        if not kept or self.on_output is None:
            return
        try:
            self.on_output(name, kept)
        except Exception:
            log.warning("the output listener raised; it gets no more of this call's output", exc_info=True)
            self.on_output = None


class Demuxer:
    """Splits Docker's multiplexed attach stream (8-byte headers) into (stream, bytes) frames."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[tuple[int, bytes]]:
        self._buf += data
        frames = []
        while len(self._buf) >= 8:
            stream, size = self._buf[0], struct.unpack(">I", self._buf[4:8])[0]
            if len(self._buf) < 8 + size:
                # Hand over a partial frame's payload now so a frame larger than the cap is
                # seen (and cut) without buffering all of it.
                if len(self._buf) > 8:
                    payload = bytes(self._buf[8:])
                    frames.append((stream, payload))
                    self._buf = bytearray(self._buf[:8])
                    struct.pack_into(">I", self._buf, 4, size - len(payload))
                break
            frames.append((stream, bytes(self._buf[8 : 8 + size])))
            del self._buf[: 8 + size]
        return frames


def open_attach(client: docker.DockerClient, container: Container) -> tuple[AttachStream, socket.socket]:
    """The container's attach socket: stdin, stdout and stderr, multiplexed (see Demuxer)."""
    stream = client.api.attach_socket(
        container_id(container), params={"stdin": 1, "stdout": 1, "stderr": 1, "stream": 1}
    )
    # docker-py's SocketIO over the engine's socket: the socket itself is its `_sock`.
    sock: socket.socket = getattr(stream, "_sock", stream)
    return stream, sock


def close_attach(attach: AttachStream, sock: socket.socket) -> None:
    """Close both ends of the attach stream; errors of a stream already gone are ignored."""
    # Close before killing: the engine will not finish a kill while its copy of the
    # container's output is blocked on a socket nobody reads any more.
    # shutdown, not only close: the HTTP response object still holds the fd open.
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    try:
        attach.close()
        sock.close()
    except OSError:
        pass


def pump(sock: socket.socket, stdin: bytes, streams: CappedStreams, deadline: float,
         demux: Demux) -> Outcome | None:
    """Write stdin and read output until EOF, the deadline, or a cap. Returns why we must
    kill the container, or None when it ended on its own."""
    sock.setblocking(False)
    pending = memoryview(stdin)
    if not pending:
        sock.shutdown(socket.SHUT_WR)
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return Outcome.TIMEOUT
        want_write = [sock] if pending else []
        readable, writable, _ = select.select([sock], want_write, [], min(left, 1.0))
        if writable and pending:
            try:
                sent = sock.send(pending[:65536])
                pending = pending[sent:]
            except BlockingIOError:
                pass
            except OSError as e:  # the tool closed stdin without reading it all
                if e.errno not in (errno.EPIPE, errno.ECONNRESET):
                    raise
                pending = memoryview(b"")
            if not pending:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_WR)
        if readable:
            try:
                data = sock.recv(65536)
            except BlockingIOError:
                continue
            except ConnectionResetError:
                return None
            if not data:
                return None
            for stream, payload in demux.feed(data):
                if streams.add(stream, payload):
                    return Outcome.OUTPUT_LIMIT
