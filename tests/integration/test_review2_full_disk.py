"""A full state directory under a real `ringfence serve` (second attack review, finding 9).

The server's state directory is a small tmpfs of its own, so its SQLite event log meets a real
ENOSPC once the rest of it is filled:

- a write (StartRun) answers RESOURCE_EXHAUSTED (retry later), not FAILED_PRECONDITION, and
  leaves no trace: the run does not exist;
- reads still answer, yet health says NOT_SERVING: nothing can be written;
- once space is freed (and without a restart) health says SERVING again and the same StartRun
  succeeds: the run exists once, its log starting with run_started.

PostgreSQL the same way, at the store: a database whose tablespace is a small tmpfs is filled,
an append is StoreFull (RESOURCE_EXHAUSTED), health's probe fails until space is freed.
"""

from __future__ import annotations

import os
import pwd
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from health_support import NOT_SERVING, SERVING, status_of, wait_for
from serve_support import Served

from ringfence import Client, NotFound, ResourceExhausted, RetryPolicy
from ringfence.errors import ControlError
from ringfence_server.control.config import token_digest
from ringfence_server.control.store import open_store, verify

pytestmark = pytest.mark.docker

AGENT = "full-agent-token"
TMPFS_BYTES = 4 * 1024 * 1024
"""Room for the event log of a fresh server and a few runs, small enough to fill in a moment."""


def _write_config(path) -> None:
    path.write_text(
        "[tenants.acme]\n"
        f'tokens = [{{ sha256 = "{token_digest(AGENT)}", role = "agent", subject = "agent" }}]\n'
        "[pool]\nsize = 0\n"
    )


def _need_root() -> None:
    if os.geteuid() != 0:
        if os.environ.get("RINGFENCE_REQUIRE_DOCKER") == "1":  # CI: a skip is a failure
            pytest.fail("mounting a tmpfs needs root", pytrace=False)
        pytest.skip("mounting a tmpfs needs root")


@contextmanager
def _tmpfs(mount: Path, size: int) -> Iterator[Path]:
    """A tmpfs of `size` bytes at `mount` inside the block; unmounted after it, also on failure
    (lazily when something still holds it)."""
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "ringfence-test-full", str(mount)],
                   check=True, capture_output=True)
    try:
        yield mount
    finally:
        if subprocess.run(["umount", str(mount)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(mount)], capture_output=True)


@pytest.fixture()
def small_state_dir(tmp_path):
    """A tmpfs of TMPFS_BYTES mounted as a state directory; unmounted at the end."""
    _need_root()
    mount = tmp_path / "state"
    mount.mkdir()
    with _tmpfs(mount, TMPFS_BYTES):
        yield mount


def _fill(directory) -> os.PathLike:
    """Write zeros into a file until the file system refuses (ENOSPC); its path."""
    filler = directory / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        for chunk in (1 << 16, 512, 1):
            try:
                while True:
                    os.write(fd, bytes(chunk))
            except OSError as e:
                assert e.errno == 28, e  # ENOSPC and nothing else
    finally:
        os.close(fd)
    return filler


def test_full_state_dir_is_resource_exhausted_and_not_serving_until_space_is_freed(
        small_state_dir, docker_client, tmp_path):
    config = tmp_path / "ringfence.toml"
    _write_config(config)
    server = Served(config, small_state_dir)
    try:
        client = Client(server.address, AGENT, retry=RetryPolicy(attempts=1))
        with client:
            client.start_run("before the disk filled", "before")
            assert wait_for(server.address, SERVING) == SERVING

            filler = _fill(small_state_dir)
            with pytest.raises(ResourceExhausted) as refused:
                client.start_run("while the disk is full", "during")
            assert "full" in str(refused.value)
            with pytest.raises(NotFound):
                client.get_run("during")  # nothing of it was written
            assert client.get_run("before").run_id == "before"  # reads still answer
            assert wait_for(server.address, NOT_SERVING) == NOT_SERVING

            os.remove(filler)
            assert wait_for(server.address, SERVING) == SERVING
            assert client.start_run("once space is freed", "during").run_id == "during"
            assert status_of(server.address) == SERVING
            assert sorted(r.run_id for r in client.list_runs()) == ["before", "during"]
    finally:
        server.stop()
    # The log itself: each run started once, the refused start left nothing, the chain holds.
    store = open_store(small_state_dir)
    try:
        assert store.all_runs() == [("acme", "before"), ("acme", "during")]
        assert [e.type for e in store.read("during")] == ["run_started"]
        assert all(verify(store.read(run_id)).ok for _, run_id in store.all_runs())
    finally:
        store.close()



@pytest.fixture()
def pg_on_small_tmpfs(own_pg_cluster):
    """(URL, mount) of a database whose tablespace is a tmpfs of TMPFS_BYTES above what a new
    database takes (PostgreSQL's own write-ahead log stays on the cluster's disk, so a full
    tablespace is SQLSTATE 53100, not a crashed server). Dropped and unmounted at the end."""
    import psycopg

    _need_root()
    mount = Path(tempfile.mkdtemp(prefix="ringfence-ts-"))  # outside pytest's 0700 root dirs
    owner = pwd.getpwnam("postgres")
    with _tmpfs(mount, 16 * 1024 * 1024 + TMPFS_BYTES):
        os.chown(mount, owner.pw_uid, owner.pw_gid)
        with psycopg.connect(own_pg_cluster.url(), autocommit=True) as admin:
            admin.execute(f"CREATE TABLESPACE small LOCATION '{mount}'")
            admin.execute("CREATE DATABASE on_small TABLESPACE small")
        try:
            yield own_pg_cluster.url("on_small"), mount
        finally:
            with psycopg.connect(own_pg_cluster.url(), autocommit=True) as admin:
                admin.execute("DROP DATABASE IF EXISTS on_small WITH (FORCE)")
                admin.execute("DROP TABLESPACE IF EXISTS small")
    mount.rmdir()


def test_postgres_full_tablespace_is_resource_exhausted_and_ping_fails_until_space_is_freed(pg_on_small_tmpfs):
    """PostgreSQL's disk-full (SQLSTATE 53100, from a real full tablespace) is StoreFull
    (RESOURCE_EXHAUSTED), not StoreUnavailable as every OperationalError was; health's probe
    (ping) fails with it while the disk is full and answers again once space is freed."""
    from ringfence_server.control.api.status import code_for
    from ringfence_server.control.store.postgres import PostgresEventStore

    url, mount = pg_on_small_tmpfs
    store = PostgresEventStore(url)
    try:
        store.append("r", "run_started", {"tenant": "t", "created_at": 1.0})
        filler = _fill(mount)
        refusal = None
        for _ in range(1000):  # rows fill the pages with room left, then a page must be added
            try:
                store.append("r", "note", {"blob": "x" * 1500})
            except ControlError as e:
                refusal = e
                break
        assert refusal is not None and code_for(refusal).name == "RESOURCE_EXHAUSTED", repr(refusal)
        written = len(store.read("r"))
        with pytest.raises(ControlError) as probe:
            store.ping()
        assert code_for(probe.value).name == "RESOURCE_EXHAUSTED"
        os.remove(filler)
        store.ping()
        store.append("r", "note", {"blob": "after"})
        events = store.read("r")
        assert len(events) == written + 1 and events[-1].data == {"blob": "after"}
        assert verify(events).ok
    finally:
        store.close()
