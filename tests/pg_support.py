"""A throwaway PostgreSQL cluster for tests: fixtures `pg_cluster` (session) and `pg_url` (a fresh
database per test).

The cluster lives in a temporary directory owned by the `postgres` system user (PostgreSQL
refuses to run as root), listens only on 127.0.0.1 at a free port with its unix socket in that
directory, trusts loopback connections, and is stopped and removed at the end of the session,
also when tests failed or the start itself failed half way. Missing binaries skip the tests,
except in CI (RINGFENCE_REQUIRE_DOCKER=1), where they fail: `make postgres` installs them.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

import pytest

REQUIRE = os.environ.get("RINGFENCE_REQUIRE_DOCKER") == "1"
START_TIMEOUT_S = 60


def _unavailable(reason: str) -> NoReturn:
    # As tests/conftest.py: in CI a missing part is a failure, never a silent skip.
    if REQUIRE:
        pytest.fail(reason, pytrace=False)
    pytest.skip(reason)


def pg_bin_dir() -> Path | None:
    """Where initdb and pg_ctl are: on PATH, else Debian's /usr/lib/postgresql/<ver>/bin (newest)."""
    initdb = shutil.which("initdb")
    if initdb and shutil.which("pg_ctl"):
        return Path(os.path.realpath(initdb)).parent
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"),
                   key=lambda p: int(Path(p).parts[-3]) if Path(p).parts[-3].isdigit() else 0)
    return Path(found[-1]).parent if found else None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class PgCluster:
    bin_dir: Path
    root: Path
    port: int = 0
    started: bool = False

    @property
    def data(self) -> Path:
        return self.root / "data"

    @property
    def log(self) -> Path:
        return self.root / "postgres.log"

    def url(self, dbname: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{dbname}"

    def _as_postgres(self, *argv: str, timeout: float = START_TIMEOUT_S) -> subprocess.CompletedProcess:
        cmd = [str(self.bin_dir / argv[0]), *argv[1:]]
        if os.geteuid() == 0:
            cmd = ["runuser", "-u", "postgres", "--", *cmd]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=self.root)

    def start(self) -> None:
        if os.geteuid() == 0:
            pw = pwd.getpwnam("postgres")  # KeyError: no such user -> the caller reports it
            os.chown(self.root, pw.pw_uid, pw.pw_gid)
        os.chmod(self.root, 0o700)
        proc = self._as_postgres("initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust",
                                 "-E", "UTF8", "--locale=C", "--no-sync")
        if proc.returncode != 0:
            raise RuntimeError(f"initdb failed ({proc.returncode}): {proc.stderr[-2000:]}")
        last = ""
        for _ in range(5):  # a free port can be taken between choosing and binding it
            self.port = _free_port()
            proc = self._pg_ctl_start()
            if proc.returncode == 0:
                self.started = True
                return
            last = proc.stdout[-1000:] + proc.stderr[-1000:] + self._log_tail()
        raise RuntimeError(f"pg_ctl start failed: {last}")

    def _pg_ctl_start(self) -> subprocess.CompletedProcess:
        options = (f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self.root} "
                   "-c max_connections=200 -c log_min_messages=warning")
        return self._as_postgres("pg_ctl", "start", "-D", str(self.data), "-l", str(self.log), "-w",
                                 "-t", str(START_TIMEOUT_S), "-o", options)

    def pause(self) -> None:
        """Stop the server, keeping its data and port (an outage a test recovers from)."""
        proc = self._as_postgres("pg_ctl", "stop", "-D", str(self.data), "-m", "fast", "-w", "-t", "60")
        if proc.returncode != 0:
            raise RuntimeError(f"pg_ctl stop failed: {proc.stderr[-1000:]}")

    def resume(self) -> None:
        proc = self._pg_ctl_start()
        if proc.returncode != 0:
            raise RuntimeError(f"pg_ctl start failed: {proc.stderr[-1000:]}{self._log_tail()}")

    def _log_tail(self) -> str:
        try:
            return self.log.read_text(errors="replace")[-2000:]
        except OSError:
            return ""

    def stop(self) -> None:
        try:
            # Also after a start that timed out: a postmaster may be running without pg_ctl's word.
            if self.started or (self.data / "postmaster.pid").exists():
                self._as_postgres("pg_ctl", "stop", "-D", str(self.data), "-m", "immediate", "-w", "-t", "60")
        finally:
            shutil.rmtree(self.root, ignore_errors=True)

    def create_database(self) -> str:
        import psycopg
        from psycopg import sql

        name = "t_" + uuid.uuid4().hex[:16]
        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        return name

    def listeners(self, name: str) -> int:
        """How many event store listeners of this process are connected to database `name`."""
        import psycopg

        with psycopg.connect(self.url(), autocommit=True) as conn:
            row = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND application_name = %s",
                               (name, f"ringfence-listen:{os.getpid()}")).fetchone()
        return int(row[0]) if row else 0

    def drop_database(self, name: str) -> None:
        import psycopg
        from psycopg import sql

        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


@contextmanager
def _cluster() -> Iterator[PgCluster]:
    bin_dir = pg_bin_dir()
    if bin_dir is None:
        _unavailable("PostgreSQL's initdb/pg_ctl are missing (run `make postgres`)")
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            _unavailable("there is no `postgres` system user to run PostgreSQL as (run `make postgres`)")
    # Not under pytest's tmp dirs: those are 0700 root, which the postgres user cannot enter.
    cluster = PgCluster(bin_dir, Path(tempfile.mkdtemp(prefix="ringfence-pg-")))
    try:
        cluster.start()
    except BaseException:
        cluster.stop()
        raise
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def pg_cluster():
    """A PostgreSQL cluster of our own on 127.0.0.1, for the whole session."""
    with _cluster() as cluster:
        yield cluster


@pytest.fixture()
def own_pg_cluster():
    """A cluster for one test alone: it may stop and restart it (outages, failover)."""
    with _cluster() as cluster:
        yield cluster


@pytest.fixture()
def pg_url(pg_cluster):
    """The URL of a new, empty database, dropped after the test."""
    name = pg_cluster.create_database()
    try:
        yield pg_cluster.url(name)
    finally:
        left = pg_cluster.listeners(name)
        pg_cluster.drop_database(name)
        # A store this process opened and never closed keeps a listener thread that would retry a
        # dropped database for the rest of the session (its log lines outliving pytest's streams).
        assert left == 0, f"the test left {left} PostgreSQL event store(s) open: close what it opens"
