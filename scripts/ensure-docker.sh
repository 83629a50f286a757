#!/usr/bin/env bash
# Make sure a Docker engine answers. If none does and we are root on Debian, install Debian's
# docker.io and start dockerd ourselves; otherwise say exactly what is missing and stop.
set -euo pipefail

answers() { timeout 10 docker info >/dev/null 2>&1; }

if command -v docker >/dev/null 2>&1 && answers; then
  exit 0
fi

if [ "$(id -u)" != 0 ] || [ ! -f /etc/debian_version ]; then
  echo "error: no Docker engine answers 'docker info'." >&2
  echo "  ringfence runs every tool call in a Docker container and needs a local engine." >&2
  echo "  Install Docker (Debian: apt-get install docker.io), start it, and make sure this user" >&2
  echo "  may use /var/run/docker.sock; then run this again." >&2
  exit 1
fi

if ! command -v dockerd >/dev/null 2>&1; then
  echo "==> installing docker.io from Debian's packages" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q
  apt-get install -y -q docker.io
fi

if ! pgrep -x dockerd >/dev/null 2>&1; then
  echo "==> starting dockerd (log: /var/log/ringfence-dockerd.log)" >&2
  nohup dockerd >/var/log/ringfence-dockerd.log 2>&1 &
fi

for i in $(seq 1 60); do
  if answers; then echo "==> Docker engine answers" >&2; exit 0; fi
  sleep 1
done
echo "error: dockerd was started but 'docker info' still fails after 60 s; see /var/log/ringfence-dockerd.log" >&2
exit 1
