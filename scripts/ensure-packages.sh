#!/usr/bin/env bash
# Host packages the build and the sandbox need, from Debian's packages:
# - debootstrap, to build the pinned base image without any registry;
# - openssl, for the test certificates;
# - Docker's own default seccomp profile (shipped by golang-github-docker-docker-dev, the same
#   Debian source as docker.io). Only that one file is extracted; the package is not installed
#   (it would pull in a Go source tree). ringfence_server/sandbox/seccomp.py derives our profile from it.
set -euo pipefail
cd "$(dirname "$0")/.."

SECCOMP_DIR=build/seccomp
SECCOMP_FILE=$SECCOMP_DIR/docker-default.json
SECCOMP_IN_DEB=./usr/share/gocode/src/github.com/docker/docker/profiles/seccomp/default.json

need_root() {
  if [ "$(id -u)" != 0 ] || [ ! -f /etc/debian_version ]; then
    echo "error: $1 is missing; install it (Debian: $2) and run this again." >&2
    exit 1
  fi
}
apt_updated=""
apt_update() { [ -n "$apt_updated" ] || { apt-get update -q >&2; apt_updated=1; }; }

if ! command -v debootstrap >/dev/null 2>&1; then
  need_root debootstrap "apt-get install debootstrap"
  apt_update
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q debootstrap >&2
fi

# openssl makes the throwaway certificates of the TLS and egress tests.
if ! command -v openssl >/dev/null 2>&1; then
  need_root openssl "apt-get install openssl"
  apt_update
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q openssl >&2
fi

if [ ! -s "$SECCOMP_FILE" ]; then
  if [ -s "/usr/share/gocode/src/github.com/docker/docker/profiles/seccomp/default.json" ]; then
    mkdir -p "$SECCOMP_DIR"
    cp "/usr/share/gocode/src/github.com/docker/docker/profiles/seccomp/default.json" "$SECCOMP_FILE"
  else
    need_root "Docker's default seccomp profile" "apt-get download golang-github-docker-docker-dev"
    apt_update
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
    (cd "$tmp" && apt-get download -q golang-github-docker-docker-dev >&2)
    mkdir -p "$SECCOMP_DIR"
    dpkg-deb --fsys-tarfile "$tmp"/golang-github-docker-docker-dev_*.deb | tar -xO "$SECCOMP_IN_DEB" > "$SECCOMP_FILE.tmp"
    mv "$SECCOMP_FILE.tmp" "$SECCOMP_FILE"
  fi
  echo "==> Docker's default seccomp profile at $SECCOMP_FILE" >&2
fi
