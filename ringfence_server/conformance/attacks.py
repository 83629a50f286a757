"""The battery's attack scripts that are not posture probes: the ceilings' (cases 30-37) and the
no-egress network view (cases 25, 26, 28). Moved here from tests/escape/test_ceilings.py and
test_network.py, which import them, so that `ringfence conformance` runs exactly the battery's
attacks. Each is an argv or a stdlib-only script run with `python3 -c` inside the sandbox.

CPU_QUOTA is conformance's own: the battery reads the container's CPU cgroup from the host
while CPU_BURN runs (a host-side fixture); a user's run measures the quota from inside instead.
"""

from __future__ import annotations

# -- 30. fork bomb -----------------------------------------------------------------------------

# The classic bomb, with the tool's own process kept alive (exec, no fork needed) so the call
# does not end "ok" the moment the first shell returns and tini exits with it. Its shells' "Cannot
# fork" complaints go to /dev/null: on a busy host enough of them reached the call's output cap
# first (the call then ends `output_limit`, case 35's outcome, not this case's), so the case
# would have measured the host's speed rather than the pids limit.
FORK_BOMB = ["sh", "-c", "exec 2>/dev/null; bomb() { bomb | bomb & }; bomb; exec sleep 1000"]

# The bounded form of the attack: fork N sleepers, report how many forks succeeded, the first
# error, and how many processes the sandbox holds. Bounded, so it is safe without a limit.
FORK_COUNTER = r"""
import errno, json, os, sys, time
n = int(sys.argv[1])
spawned, error = 0, None
for _ in range(n):
    try:
        pid = os.fork()
    except OSError as e:
        error = errno.errorcode[e.errno]
        break
    if pid == 0:
        time.sleep(60)
        os._exit(0)
    spawned += 1
procs = sum(1 for d in os.listdir("/proc") if d.isdigit())
print(json.dumps({"spawned": spawned, "error": error, "procs": procs}), flush=True)
os._exit(0)
"""

# -- 31. memory bomb ---------------------------------------------------------------------------

# b"x" * n writes every byte (bytearray(n) would only reserve zero pages and never be charged).
MEMORY_BOMB = ["python3", "-c", "x = b'x' * (1 << 30); print('allocated', len(x))"]

# -- 32. CPU burn ------------------------------------------------------------------------------

CPU_BURN = ["sh", "-c", "for i in 1 2 3; do (while :; do :; done) & done; wait"]

# Conformance's form of case 32, measured from inside: N busy processes for WINDOW seconds, then
# the CPU time they got (utime + stime of each, from /proc) over the wall time, printed; then the
# parent waits for the wall limit to kill the container (the call must end `timeout`).
CPU_QUOTA = r"""
import json, os, sys, time
n, window = int(sys.argv[1]), float(sys.argv[2])
tick = os.sysconf("SC_CLK_TCK")
children = []
for _ in range(n):
    pid = os.fork()
    if pid == 0:
        while True:
            pass
    children.append(pid)

def cpu():
    total = 0
    for pid in children:
        with open(f"/proc/{pid:d}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / tick

t0, c0 = time.monotonic(), cpu()
time.sleep(window)
t1, c1 = time.monotonic(), cpu()
print(json.dumps({"busy": n, "wall_s": t1 - t0, "cpu_s": c1 - c0}), flush=True)
while True:
    time.sleep(1)
"""

# -- 33. disk fill and fsize ---------------------------------------------------------------------

WRITER = r"""
import errno, json, signal, sys
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # so the limit shows as EFBIG, not a kill
total, chunk = int(sys.argv[1]), 64 * 1024
written, error = 0, None
try:
    with open("/tmp/fill", "wb", buffering=0) as f:
        while written < total:
            written += f.write(b"x" * min(chunk, total - written))
except OSError as e:
    error = errno.errorcode[e.errno]
print(json.dumps({"written": written, "error": error}))
"""

# -- 34. file descriptors ------------------------------------------------------------------------

FD_OPENER = r"""
import errno, json, os, sys
most = int(sys.argv[1])
fds, error = [], None
try:
    while len(fds) < most:
        fds.append(os.open("/dev/null", os.O_RDONLY))
except OSError as e:
    error = errno.errorcode[e.errno]
print(json.dumps({"opened": len(fds), "highest": max(fds), "error": error}))
"""

# -- 35. output floods ---------------------------------------------------------------------------

BINARY_FLOOD = "import sys\nw = sys.{0}.buffer.write\nwhile True:\n    w(b'\\xff\\x00' * 32768)\n    sys.{0}.flush()"
FLOODS = {
    "yes-stdout": (["sh", "-c", "exec yes"], "stdout"),
    "zero-stdout": (["sh", "-c", "exec cat /dev/zero"], "stdout"),
    "binary-stdout": (["python3", "-c", BINARY_FLOOD.format("stdout")], "stdout"),
    "yes-stderr": (["sh", "-c", "exec yes >&2"], "stderr"),
    "zero-stderr": (["sh", "-c", "exec cat /dev/zero >&2"], "stderr"),
    "binary-stderr": (["python3", "-c", BINARY_FLOOD.format("stderr")], "stderr"),
}

# -- 36. setsid and TERM-trapping processes --------------------------------------------------------

LINGERERS = r"""
setsid sleep 1000.{token} &
(trap '' TERM HUP; exec sleep 1001.{token}) &
stubborn=$!
setsid sh -c 'trap "" TERM HUP INT; while :; do sleep 1002.{token}; done' &
sleep 0.5
kill -TERM $stubborn
sleep 0.3
kill -0 $stubborn && echo "survived TERM"
wait
"""

# -- 37. orphans and zombies ---------------------------------------------------------------------

ORPHANS = r"""
import json, os, sys, time
token = sys.argv[1]
for _ in range(5):
    child = os.fork()
    if child == 0:
        if os.fork() == 0:           # grandchild: orphaned as soon as its parent exits
            time.sleep(0.2)
            os._exit(0)
        os._exit(0)
    os.waitpid(child, 0)              # the middle process is reaped; the grandchild is not ours
# A long-lived double-forked orphan too, which must not survive teardown.
if os.fork() == 0:
    if os.fork() == 0:
        os.execvp("sleep", ["sleep", "1003." + token])
    os._exit(0)
os.wait()

def states():
    out = {}
    for d in os.listdir("/proc"):
        if d.isdigit() and int(d) not in (1, os.getpid()):
            try:
                text = open(f"/proc/{d}/stat").read()
            except OSError:
                continue
            out[int(d)] = text.rsplit(")", 1)[1].split()[0]
    return out

for _ in range(100):                  # wait until the short-lived orphans have all exited
    if sum(1 for s in states().values() if s != "Z") <= 1:
        break
    time.sleep(0.05)
for _ in range(40):                   # and give their reaper (if any) a moment to collect them
    if not any(s == "Z" for s in states().values()):
        break
    time.sleep(0.05)
now = states()
print(json.dumps({"pid": os.getpid(), "zombies": sum(s == "Z" for s in now.values()), "others": len(now)}))
"""

# -- 25, 26, 28. the network of a no-egress tool, as the sandbox sees it ------------------------

# What the sandbox sees, and (only when that view holds nothing but lo) whether the metadata
# address and names can be reached. Prints one JSON object.
VIEW_PROBE = r"""
import errno, json, socket, sys
def ename(e):
    return errno.errorcode.get(e.errno, str(e.errno)) if e.errno else type(e).__name__
ifaces = [l.split(":")[0].strip() for l in open("/proc/net/dev").read().splitlines()[2:]]
routes = [l for l in open("/proc/net/route").read().splitlines()[1:] if l.strip()]
try:
    routes6 = [l for l in open("/proc/net/ipv6_route").read().splitlines()
               if l.strip() and not l.rstrip().endswith("lo")]
except OSError:
    routes6 = []
resolv = [l.split() for l in open("/etc/resolv.conf").read().splitlines() if l.strip() and not l.startswith("#")]
hosts = open("/etc/hosts").read()
out = {"ifaces": ifaces, "routes": routes, "routes6": routes6, "resolv": resolv, "hosts": hosts}
# Safety: aim at the metadata address only when no packet can leave (no interface but lo).
if ifaces == ["lo"] and not routes:
    meta = {}
    for family, addr in ((socket.AF_INET, ("169.254.169.254", 80)), (socket.AF_INET6, ("fd00:ec2::254", 80))):
        try:
            with socket.socket(family, socket.SOCK_STREAM) as s:
                s.settimeout(2)
                s.connect(addr)
                meta[addr[0]] = "connected"
        except OSError as e:
            meta[addr[0]] = ename(e)
    names = {}
    for name in ("metadata.google.internal", "metadata", "instance-data", "instance-data.ec2.internal"):
        try:
            names[name] = sorted({a[4][0] for a in socket.getaddrinfo(name, 80)})
        except socket.gaierror as e:
            names[name] = "gaierror"
    out["metadata"] = meta
    out["metadata_names"] = names
else:
    out["metadata"] = "not probed: the sandbox has a network"
print(json.dumps(out))
"""

# DNS: a lookup whose name carries the marker (what exfiltration by query name looks like), and
# whether anything answers on the sandbox's own 127.0.0.1:53.
DNS_PROBE = r"""
import errno, json, socket, sys
def ename(e):
    if isinstance(e, socket.timeout):
        return "timeout"
    return errno.errorcode.get(e.errno, str(e.errno))
name = sys.argv[1]
out = {}
try:
    out["lookup"] = sorted({a[4][0] for a in socket.getaddrinfo(name, 80, socket.AF_INET)})
except socket.gaierror as e:
    out["lookup"] = "gaierror"
if "--local" in sys.argv:
    t = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    t.settimeout(2)
    try:
        t.connect(("127.0.0.1", 53)); out["tcp53"] = "connected"
    except OSError as e:
        out["tcp53"] = ename(e)
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    u.settimeout(2)
    try:
        u.connect(("127.0.0.1", 53))
        u.send(b"\x12\x34\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00\x01x\x00\x00\x01\x00\x01")
        u.recv(512); out["udp53"] = "answered"
    except OSError as e:
        out["udp53"] = ename(e)
print(json.dumps(out))
"""
