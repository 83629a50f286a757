#!/usr/bin/env bash
# Register gVisor (runsc) as the engine runtime "runsc", with --network=none (we only run tools
# without network under gVisor) and --oci-seccomp (without it runsc ignores the container's
# seccomp profile: unshare and io_uring would work inside the sentry). Installs Debian's runsc
# when we are root on Debian.
# Exit 0 when the runtime is registered; non-zero with a message otherwise.
set -euo pipefail

ARGS='["--network=none", "--oci-seccomp"]'
registered() { docker info --format '{{json .Runtimes}}' 2>/dev/null | grep -q '"runsc"'; }
configured() {
  [ -f /etc/docker/daemon.json ] && python3 - "$ARGS" <<'PY'
import json, sys
conf = json.load(open("/etc/docker/daemon.json"))
sys.exit(0 if conf.get("runtimes", {}).get("runsc", {}).get("runtimeArgs") == json.loads(sys.argv[1]) else 1)
PY
}

if registered && configured; then exit 0; fi

if [ "$(id -u)" != 0 ] || [ ! -f /etc/debian_version ]; then
  echo "error: the Docker engine has no 'runsc' runtime and we cannot register it (need root on Debian)." >&2
  exit 1
fi

if ! command -v runsc >/dev/null 2>&1; then
  echo "==> installing runsc (gVisor) from Debian's packages" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q
  apt-get install -y -q runsc
fi

conf=/etc/docker/daemon.json
mkdir -p /etc/docker
python3 - "$conf" "$(command -v runsc)" "$ARGS" <<'PY'
import json, os, sys
path, runsc, args = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
conf = json.load(open(path)) if os.path.exists(path) and os.path.getsize(path) else {}
conf.setdefault("runtimes", {})["runsc"] = {"path": runsc, "runtimeArgs": args}
tmp = path + ".tmp"
with open(tmp, "w") as f:
    json.dump(conf, f, indent=2)
os.replace(tmp, path)
PY

# dockerd re-reads its runtimes on SIGHUP; no restart, so running containers are untouched.
pid=$(pgrep -x dockerd | head -n 1 || true)
if [ -n "$pid" ]; then
  kill -HUP "$pid"
fi
for i in $(seq 1 20); do
  if registered && configured; then echo "==> runtime runsc registered" >&2; exit 0; fi
  sleep 1
done
echo "error: runsc written to $conf but the engine does not list it; restart dockerd" >&2
exit 1
