"""The in-sandbox relay (ringfence_server.sandbox.egress.relay), run exactly as a sandbox runs it (`python3 -I -S
-B -c <source> SOCKET PORT -- ARGV`), on the host: its TCP side on 127.0.0.1, its other side a
unix socket in a temp directory served by a small echo server here. No Docker, no network.
"""

from __future__ import annotations

import ast
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time

import pytest

from ringfence_server.sandbox.egress import relay
from ringfence_server.sandbox.egress.proxy import RELAY_SOURCE, SANDBOX_EGRESS_DIR, CallEgress

PY = sys.executable


class EchoServer:
    """A unix socket server: reads each connection to EOF, answers b"got:" + the bytes upper-cased."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.connections = 0
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(path)
        self.sock.listen(64)
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    @staticmethod
    def _serve(conn: socket.socket) -> None:
        with conn:
            data = b""
            while True:
                chunk = conn.recv(65536)
                if not chunk:
                    break
                data += chunk
            conn.sendall(b"got:" + data.upper())

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def workdir():
    d = tempfile.mkdtemp(prefix="rfr-")  # short: a unix socket path must fit in 108 bytes
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def echo(workdir):
    server = EchoServer(os.path.join(workdir, "proxy.sock"))
    yield server
    server.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def relay_run(sock: str, port: int, argv: list[str], stdin: bytes = b"", timeout: float = 60):
    return subprocess.run([PY, "-I", "-S", "-B", "-c", RELAY_SOURCE, sock, str(port), "--", *argv],
                          input=stdin, capture_output=True, timeout=timeout)


CLIENT = r"""
import socket, sys, threading
port, n, size = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
out = [None] * n
def one(i):
    s = socket.create_connection(("127.0.0.1", port), timeout=20)
    s.sendall((b"%d:" % i) + b"x" * size)
    s.shutdown(socket.SHUT_WR)
    data = b""
    while True:
        c = s.recv(65536)
        if not c:
            break
        data += c
    s.close()
    out[i] = data
ts = [threading.Thread(target=one, args=(i,)) for i in range(n)]
[t.start() for t in ts]
[t.join() for t in ts]
ok = all(out[i] == (b"got:%d:" % i) + b"X" * size for i in range(n))
print("ok" if ok else "bad %r" % [len(o or b"") for o in out])
"""


def test_splices_each_connection_both_ways_with_half_close(echo):
    port = free_port()
    r = relay_run(echo.path, port, [PY, "-c", CLIENT, str(port), "1", "5"])
    assert (r.returncode, r.stdout, r.stderr) == (0, b"ok\n", b"")
    assert echo.connections == 1


def test_many_concurrent_connections_and_large_transfers(echo):
    """More connections than fit at once (MAX_CONNECTIONS) and bodies larger than its buffers:
    every byte arrives, in order, through backpressure and the listen backlog."""
    port = free_port()
    n = relay.MAX_CONNECTIONS + 16
    r = relay_run(echo.path, port, [PY, "-c", CLIENT, str(port), str(n), str(3 * relay.BUFFER + 7)])
    assert (r.returncode, r.stdout, r.stderr) == (0, b"ok\n", b"")
    assert echo.connections == n


def test_the_tool_keeps_its_stdin_stdout_stderr_and_exit_status(echo):
    tool = "import sys; d = sys.stdin.read(); print(d.upper()); print('err', file=sys.stderr); sys.exit(7)"
    r = relay_run(echo.path, free_port(), [PY, "-c", tool], stdin=b"request")
    assert (r.returncode, r.stdout, r.stderr) == (7, b"REQUEST\n", b"err\n")


def test_the_tool_is_the_relays_process_and_inherits_no_extra_descriptor(echo):
    tool = "import os; print(os.getpid()); print(sorted(int(f) for f in os.listdir('/proc/self/fd')))"
    proc = subprocess.Popen([PY, "-I", "-S", "-B", "-c", RELAY_SOURCE, echo.path, str(free_port()), "--",
                             PY, "-c", tool], stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    out, err = proc.communicate(timeout=60)
    pid, fds = out.decode().splitlines()
    assert int(pid) == proc.pid  # exec'd in place: the tool's pid is the one the init started
    assert fds == "[0, 1, 2, 3]"  # 3 is listdir's own; no listening socket leaked in
    assert err == b""


def test_signals_python_ignores_are_default_again_for_the_tool(echo):
    """Python ignores SIGPIPE and SIGXFSZ; ignored signals survive exec. The tool must see them
    as it would without the relay (a writer killed by SIGPIPE, the fsize limit by SIGXFSZ)."""
    baseline = subprocess.run(["cat", "/proc/self/status"], capture_output=True, check=True).stdout
    r = relay_run(echo.path, free_port(), ["cat", "/proc/self/status"])
    ignored = [line for line in r.stdout.decode().splitlines() if line.startswith("SigIgn:")]
    assert ignored == [line for line in baseline.decode().splitlines() if line.startswith("SigIgn:")]


def test_the_relay_ends_when_the_tool_does(echo):
    tool = ("import os\n"
            "me = str(os.getpid())\n"
            "for p in os.listdir('/proc'):\n"
            "    if p.isdigit():\n"
            "        try:\n"
            "            stat = open(f'/proc/{p}/stat').read()\n"
            "        except OSError:\n"
            "            continue\n"
            "        if stat.rsplit(')', 1)[1].split()[1] == me:\n"
            "            print(p)\n")
    r = relay_run(echo.path, free_port(), [PY, "-c", tool])
    [child] = r.stdout.decode().split()  # the relay, forked before the exec

    def gone() -> bool:
        try:
            with open(f"/proc/{child}/stat") as f:
                return f.read().rsplit(")", 1)[1].split()[0] == "Z"
        except OSError:
            return True

    end = time.monotonic() + 15
    while not gone() and time.monotonic() < end:
        time.sleep(0.05)
    assert gone()


def test_a_vanished_proxy_socket_ends_the_tools_connection_cleanly(echo):
    tool = (f"import os, socket\nos.unlink({echo.path!r})\n"
            "s = socket.create_connection(('127.0.0.1', int(os.environ['P'])), timeout=10)\n"
            "try:\n    print(repr(s.recv(10)))\nexcept ConnectionResetError:\n    print('reset')\n")
    port = free_port()
    r = subprocess.run([PY, "-I", "-S", "-B", "-c", RELAY_SOURCE, echo.path, str(port), "--", PY, "-c", tool],
                       capture_output=True, timeout=60, env={"P": str(port), "PATH": os.environ.get("PATH", "")})
    assert r.returncode == 0 and r.stdout.strip() in (b"b''", b"reset")


# -- failing before exec: status 125, a message, and the tool never runs ---------------------------


def marker_tool(workdir):
    marker = os.path.join(workdir, "ran")
    return marker, ["touch", marker]


def test_a_missing_socket_stops_before_the_tool_runs(workdir):
    marker, tool = marker_tool(workdir)
    r = relay_run(os.path.join(workdir, "nothing.sock"), free_port(), tool)
    assert r.returncode == relay.EXIT_SETUP == 125
    assert b"ringfence egress relay: the egress socket" in r.stderr and b"is not there" in r.stderr
    assert not os.path.exists(marker)


def test_a_path_that_is_not_a_socket_stops_before_the_tool_runs(workdir):
    marker, tool = marker_tool(workdir)
    path = os.path.join(workdir, "file")
    open(path, "w").close()
    r = relay_run(path, free_port(), tool)
    assert r.returncode == 125 and b"is not a socket" in r.stderr
    assert not os.path.exists(marker)


def test_a_port_that_cannot_be_bound_stops_before_the_tool_runs(echo, workdir):
    marker, tool = marker_tool(workdir)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        r = relay_run(echo.path, taken.getsockname()[1], tool)
    assert r.returncode == 125 and b"cannot listen on 127.0.0.1:" in r.stderr
    assert not os.path.exists(marker)


@pytest.mark.parametrize("args", [[], ["s"], ["s", "3128"], ["s", "3128", "--"], ["s", "x", "--", "true"],
                                  ["s", "0", "--", "true"], ["s", "3128", "true"]])
def test_malformed_arguments_stop_before_anything(args):
    r = subprocess.run([PY, "-I", "-S", "-B", "-c", RELAY_SOURCE, *args], capture_output=True, timeout=30)
    assert r.returncode == 125 and r.stderr.startswith(b"ringfence egress relay: ")


def test_a_command_that_cannot_be_run_is_127_like_a_shell(echo):
    r = relay_run(echo.path, free_port(), ["/nonexistent/tool"])
    assert r.returncode == 127 and b"cannot run '/nonexistent/tool'" in r.stderr


# -- how the host starts it ----------------------------------------------------------------------


def test_the_relay_is_stdlib_only_and_its_source_is_passed_with_dash_c():
    tree = ast.parse(RELAY_SOURCE)
    imported = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
                for alias in node.names}
    imported |= {node.module.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert imported <= set(sys.stdlib_module_names)
    call = CallEgress("c1", "u", "/state/calls/tok", {}, port=3128)
    assert call.relay_argv() == ["python3", "-I", "-S", "-B", "-c", RELAY_SOURCE,
                                 f"{SANDBOX_EGRESS_DIR}/proxy.sock", "3128", "--"]
    mount = call.mount()
    assert (mount["Target"], mount["Source"], mount["ReadOnly"], mount["Type"]) == (
        "/run/ringfence/egress", "/state/calls/tok", True, "bind")
