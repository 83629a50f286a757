#!/usr/bin/env bash
# PostgreSQL's server binaries (initdb, pg_ctl, postgres) and its `postgres` system user, for the
# store tests: they start a throwaway cluster of their own (tests/pg_support.py) and never use a
# system one. Installs Debian's `postgresql` package when we are root on Debian, WITHOUT the
# default cluster Debian would otherwise create and start on port 5432.
# Idempotent. Exit 0 when the binaries are there; non-zero with a message otherwise.
set -euo pipefail

have_binaries() {
  if command -v initdb >/dev/null 2>&1 && command -v pg_ctl >/dev/null 2>&1; then return 0; fi
  compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null && compgen -G '/usr/lib/postgresql/*/bin/pg_ctl' >/dev/null
}

if have_binaries && id -u postgres >/dev/null 2>&1; then exit 0; fi

if [ "$(id -u)" != 0 ] || [ ! -f /etc/debian_version ]; then
  echo "error: PostgreSQL's initdb/pg_ctl (or the postgres user) are missing; install them" \
       "(Debian: apt-get install postgresql) and run this again." >&2
  exit 1
fi

echo "==> installing PostgreSQL from Debian's packages (no default cluster)" >&2
# postgresql-common reads this before creating the "main" cluster: the tests need none, and a
# server left listening on 5432 is not something a test setup should leave behind.
conf=/etc/postgresql-common/createcluster.conf
if [ ! -f "$conf" ]; then
  mkdir -p "$(dirname "$conf")"
  echo "create_main_cluster = false" > "$conf"
elif command -v pg_conftool >/dev/null 2>&1; then
  pg_conftool "$conf" set create_main_cluster false
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -q >&2
# confold: keep the createcluster.conf written above instead of asking about it.
apt-get install -y -q -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold postgresql >&2

if ! have_binaries; then
  echo "error: the postgresql package is installed but initdb/pg_ctl were not found" >&2
  exit 1
fi
