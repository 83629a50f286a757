"""A PostgreSQL outage under a real `ringfence serve` (second attack review, finding 12).

The database is stopped (pg_ctl stop, not a wrong URL) while the server is up, with its shipped
defaults (`limits.store_timeout_s`, `limits.health_interval_s`):

- Several GetRuns of the SAME run sent at once each answer UNAVAILABLE (the retryable code)
  within a client deadline a little over ONE store timeout: nothing holds the run's lock while
  waiting for the store, so no reader queues behind another's timeout. Before the fix they
  queued (30 s, 60 s, ...) and the clients saw DEADLINE_EXCEEDED.
- An outage shorter than the old detection delay (5.6-6.6 s) is seen on a health Watch stream:
  NOT_SERVING while the database is down, SERVING again after it restarts, without a restart of
  the server.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

import grpc
import pytest
from health_support import NOT_SERVING, SERVING, Watcher, wait_for
from serve_support import Served

from ringfence import Client, RetryPolicy
from ringfence.errors import Unavailable
from ringfence_server.control.config import Limits, token_digest

pytestmark = pytest.mark.docker

AGENT = "outage-agent-token"
RUN = "outage-run"
READERS = 4
CLIENT_DEADLINE_S = 8.0
"""A little over one store timeout (limits.store_timeout_s, 5 s by default: checked below): a
reader queued behind another reader's timeout cannot make it."""
SHORT_OUTAGE_S = 2.0
"""The database stays stopped this long (plus pg_ctl's own start): shorter than the 5.6 s after
which the old health check noticed an outage, longer than one health round."""


def _write_config(path) -> None:
    path.write_text(
        "[tenants.acme]\n"
        f'tokens = [{{ sha256 = "{token_digest(AGENT)}", role = "agent", subject = "agent" }}]\n'
        "[pool]\nsize = 0\n"
    )


CALLS = {
    "get_run": lambda client: client.get_run(RUN),
    # StartRun of the same id is idempotent, so it reads the store first: it too must not
    # queue (it once held a lock per run id across its store calls).
    "start_run": lambda client: client.start_run("read while the database is down", RUN),
}


def _code_of(address: str, call) -> str:
    """The status code one call on RUN answers (no client retry: the server's own answer)."""
    with Client(address, AGENT, timeout=CLIENT_DEADLINE_S, retry=RetryPolicy(attempts=1)) as client:
        try:
            call(client)
        except Unavailable:
            return "UNAVAILABLE"
        except grpc.RpcError as e:
            return e.code().name
        except Exception as e:  # noqa: BLE001 - any other answer is reported, not raised
            return type(e).__name__
    return "OK"


@contextmanager
def _database_stopped(cluster) -> Iterator[None]:
    """The database stopped (its data and port kept) inside the block, started again after it,
    also when the block fails: a server left without its database would take its calls'
    timeouts to stop."""
    cluster.pause()
    try:
        yield
    finally:
        cluster.resume()


@pytest.fixture()
def served(own_pg_cluster, docker_client, tmp_path):
    config = tmp_path / "ringfence.toml"
    _write_config(config)
    server = Served(config, tmp_path / "state", "--database-url", own_pg_cluster.url())
    try:
        yield server
    finally:
        server.stop()


@pytest.mark.parametrize("call", sorted(CALLS))
def test_readers_of_one_run_each_get_unavailable_after_one_store_timeout(served, own_pg_cluster, call):
    with Client(served.address, AGENT) as client:
        client.start_run("read while the database is down", RUN)
        assert client.get_run(RUN).run_id == RUN

    codes: list[str] = []
    lock = threading.Lock()

    def read() -> None:
        code = _code_of(served.address, CALLS[call])
        with lock:
            codes.append(code)

    with _database_stopped(own_pg_cluster):
        readers = [threading.Thread(target=read) for _ in range(READERS)]
        for t in readers:
            t.start()
        for t in readers:
            t.join(120)
    assert codes == ["UNAVAILABLE"] * READERS, codes
    # The deadline above is "a little over one store timeout" of the shipped default.
    assert Limits().store_timeout_s + 2.0 <= CLIENT_DEADLINE_S < 2 * Limits().store_timeout_s
    # Recovery without restart: the same run is served again.
    with Client(served.address, AGENT) as client:
        assert client.get_run(RUN).run_id == RUN


def test_health_reports_an_outage_shorter_than_the_old_detection_delay(served, own_pg_cluster):
    assert wait_for(served.address, SERVING) == SERVING
    watcher = Watcher(served.address)
    try:
        assert watcher.wait_for(SERVING) == [SERVING]
        with _database_stopped(own_pg_cluster):
            threading.Event().wait(SHORT_OUTAGE_S)
        seen = watcher.wait_for(SERVING, NOT_SERVING, SERVING)
        assert seen == [SERVING, NOT_SERVING, SERVING], seen
    finally:
        watcher.close()
