"""The sandbox's end of egress: 127.0.0.1:PORT inside the sandbox, spliced to the call's socket.

An egress-enabled sandbox has no network at all (network_mode=none: only `lo`). Its one way out
is a unix socket of its own, `/run/ringfence/egress/proxy.sock`, on which the egress proxy
listens for that call alone. Tools expect an HTTP proxy at host:port, so this relay listens on
the sandbox's loopback and copies each TCP connection to a fresh connection on that socket,
byte for byte; it reads nothing, changes nothing and decides nothing (the proxy does).

It is the tool's command prefix, passed as source with -c (stdlib only, no image change):

    python3 -I -S -B -c <this file> /run/ringfence/egress/proxy.sock 3128 -- ARGV...

Order: check that the socket is there, bind and listen, then fork. The child relays; the parent
restores the signal dispositions Python changed and execs ARGV, so the tool keeps this process:
its pid, stdin, stdout, stderr and exit status are exactly the tool's, and the listening socket
is close-on-exec, so the tool inherits no extra descriptor. When the socket is missing or the
port cannot be bound, it says so on stderr and exits 125 before anything is exec'd. The child
exits when the tool does (in a container the engine would end it anyway with PID 1).

Authority: the relay runs as the tool's uid, in the tool's namespaces and cgroup, under the
tool's limits. It can do nothing the tool could not do itself (the tool may connect to the
socket directly), so it is a convenience and not a boundary: the boundary is the proxy, which
serves on this socket only this call's grant.

Bounded: one thread (selectors), at most MAX_CONNECTIONS spliced at once (further clients
wait in the listen backlog), BUFFER bytes queued per direction per connection.
"""

from __future__ import annotations

import os
import selectors
import signal
import socket
import stat
import sys

EXIT_SETUP = 125
MAX_CONNECTIONS = 64
BUFFER = 65536
BACKLOG = 128
# How often the relay checks that the tool is still alive (it exits when it is not).
PARENT_POLL_S = 0.5


def _say(message: str) -> None:
    try:
        sys.stderr.write(f"ringfence egress relay: {message}\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass


def parse(argv: list[str]) -> tuple[str, int, list[str]]:
    """argv = [socket path, port, "--", command...] -> (path, port, command); ValueError."""
    if len(argv) < 4 or argv[2] != "--":
        raise ValueError("usage: relay SOCKET PORT -- COMMAND [ARG...]")
    path, port_text, command = argv[0], argv[1], list(argv[3:])
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ValueError(f"bad port {port_text!r}")
    return path, int(port_text), command


def check_socket(path: str) -> None:
    try:
        st = os.stat(path)
    except OSError as e:
        raise ValueError(f"the egress socket {path} is not there ({e.strerror})") from None
    if not stat.S_ISSOCK(st.st_mode):
        raise ValueError(f"{path} is not a socket")


def listen(port: int) -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))
        s.listen(BACKLOG)
    except OSError as e:
        s.close()
        raise ValueError(f"cannot listen on 127.0.0.1:{port} ({e.strerror})") from None
    s.setblocking(False)
    return s


class Link:
    """One spliced pair: socks[0] the tool's TCP connection, socks[1] the proxy's socket.
    bufs[i] holds bytes read from socks[i] not yet written to socks[1 - i]."""

    def __init__(self, sel: selectors.BaseSelector, client: socket.socket, upstream: socket.socket) -> None:
        self.sel = sel
        self.socks = (client, upstream)
        self.bufs = (bytearray(), bytearray())
        self.eof = [False, False]
        self.shut = [False, False]  # SHUT_WR sent to socks[i]
        self.wanted = [0, 0]
        self.closed = False
        for s in self.socks:
            s.setblocking(False)
        self.update()

    def update(self) -> None:
        for i, s in enumerate(self.socks):
            events = 0
            if not self.eof[i] and len(self.bufs[i]) < BUFFER:
                events |= selectors.EVENT_READ
            if self.bufs[1 - i]:
                events |= selectors.EVENT_WRITE
            if events == self.wanted[i]:
                continue
            if self.wanted[i] == 0:
                self.sel.register(s, events, (self, i))
            elif events == 0:
                self.sel.unregister(s)
            else:
                self.sel.modify(s, events, (self, i))
            self.wanted[i] = events

    def ready(self, i: int, mask: int) -> None:
        if self.closed:  # its other socket, in the same select() round, ended it
            return
        try:
            if mask & selectors.EVENT_READ:
                data = self.socks[i].recv(BUFFER - len(self.bufs[i]))
                if data:
                    self.bufs[i].extend(data)
                else:
                    self.eof[i] = True
            if mask & selectors.EVENT_WRITE:
                sent = self.socks[i].send(self.bufs[1 - i])
                del self.bufs[1 - i][:sent]
            for j in (0, 1):
                # A direction whose source ended and whose bytes are all delivered is half-closed
                # on the other side, as the source did (HTTP bodies delimited by EOF need it).
                if self.eof[j] and not self.bufs[j] and not self.shut[1 - j]:
                    self.socks[1 - j].shutdown(socket.SHUT_WR)
                    self.shut[1 - j] = True
        except (BlockingIOError, InterruptedError):
            pass
        except OSError:
            self.close()
            return
        if self.shut[0] and self.shut[1]:
            self.close()
        else:
            self.update()

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        for i, s in enumerate(self.socks):
            if self.wanted[i]:
                self.sel.unregister(s)
                self.wanted[i] = 0
            s.close()


def serve(listener: socket.socket, path: str, parent: int) -> None:
    """Relay until the tool (our parent) is gone."""
    sel = selectors.DefaultSelector()
    sel.register(listener, selectors.EVENT_READ, None)
    links: set[Link] = set()
    accepting = True
    while True:
        for key, mask in sel.select(PARENT_POLL_S):
            if key.data is None:
                try:
                    client, _ = listener.accept()
                except (BlockingIOError, InterruptedError):
                    continue
                except OSError:
                    continue
                client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                upstream.setblocking(False)
                try:
                    upstream.connect(path)
                except OSError:
                    # The proxy is gone or its backlog is full: the tool sees the connection end.
                    upstream.close()
                    client.close()
                    continue
                links.add(Link(sel, client, upstream))
            else:
                link, i = key.data
                link.ready(i, mask)
        links = {link for link in links if not link.closed}
        # Past the bound, leave further clients in the kernel's backlog until a link ends.
        if accepting and len(links) >= MAX_CONNECTIONS:
            sel.unregister(listener)
            accepting = False
        elif not accepting and len(links) < MAX_CONNECTIONS:
            sel.register(listener, selectors.EVENT_READ, None)
            accepting = True
        if os.getppid() != parent:
            return


def _to_devnull(fds: tuple[int, ...]) -> None:
    null = os.open(os.devnull, os.O_RDWR)
    for fd in fds:
        os.dup2(null, fd)
    os.close(null)


def main(argv: list[str]) -> int:
    try:
        path, port, command = parse(argv)
        check_socket(path)
        listener = listen(port)
    except ValueError as e:
        _say(str(e))
        return EXIT_SETUP
    parent = os.getpid()
    try:
        child = os.fork()
    except OSError as e:
        _say(f"cannot start the relay ({e.strerror})")
        return EXIT_SETUP
    if child == 0:
        # The relay: never the tool's stdin or stdout (stderr stays, for a crash message).
        code = 0
        try:
            _to_devnull((0, 1))
            serve(listener, path, parent)
        except BaseException as e:  # noqa: BLE001 - the relay must never run on in a broken state
            _say(f"relay stopped: {type(e).__name__}: {e}")
            code = 1
        os._exit(code)
    listener.close()
    # Python ignores SIGPIPE and SIGXFSZ; ignored signals stay ignored across exec, and the tool
    # must meet them as it would without us (a pipeline's writer killed by SIGPIPE, the fsize
    # ulimit by SIGXFSZ).
    for name in ("SIGPIPE", "SIGXFSZ", "SIGXFZ"):
        if hasattr(signal, name):
            signal.signal(getattr(signal, name), signal.SIG_DFL)
    try:
        os.execvp(command[0], command)
    except OSError as e:
        _say(f"cannot run {command[0]!r}: {e.strerror}")
        return 127 if isinstance(e, FileNotFoundError) else 126


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
