"""`ringfence runs show|export|verify|prune` on real stores: a SQLite state directory and a
PostgreSQL database."""

from __future__ import annotations

import json
import sqlite3

import pytest

from ringfence.cli.main import main
from ringfence.model import Event
from ringfence_server.control.store import SqliteEventStore, open_store, verify

OLD = 1_000_000.0  # 1970: older than any --older-than


def _fill(store) -> None:
    store.append("r1", "run_started", {"tenant": "acme", "run_id": "r1", "goal": "g", "created_at": OLD})
    store.append("r1", "observation", {"call_id": "c1", "tool": "echo", "status": "executed", "executed": True,
                                       "content": {"text": "hi"}})
    store.append("r1", "run_finished", {"outcome": "completed", "reason": ""})
    store.append("live", "run_started", {"tenant": "acme", "run_id": "live", "goal": "g", "created_at": OLD})
    # A run whose id another tenant had already taken: stored under a namespaced key.
    store.append("globex/r1", "run_started", {"tenant": "globex", "run_id": "r1", "goal": "g", "created_at": OLD})


@pytest.fixture()
def state_dir(tmp_path):
    d = tmp_path / "state"
    s = SqliteEventStore(d / "events.sqlite3", clock=lambda: OLD)
    try:
        _fill(s)
    finally:
        s.close()
    return d


def ringfence(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_show_prints_the_state_the_chain_and_every_event(capsys, state_dir):
    code, out, err = ringfence(capsys, "runs", "show", "r1", "--state-dir", str(state_dir))
    assert code == 0, err
    lines = out.splitlines()
    assert "tenant acme" in lines[0] and "events 3" in lines[0] and "finished (completed)" in lines[0]
    assert lines[1].startswith("chain intact")
    assert [line.split()[0] for line in lines[2:]] == ["1", "2", "3"]
    assert "run_finished" in lines[4] and "1970-01-12T13:46:40.000Z" in lines[4]


def test_export_writes_json_lines_that_verify(capsys, state_dir):
    code, out, err = ringfence(capsys, "runs", "export", "r1", "--state-dir", str(state_dir))
    assert code == 0, err
    rows = [json.loads(line) for line in out.splitlines()]
    assert [r["seq"] for r in rows] == [1, 2, 3]
    assert set(rows[0]) == {"run_id", "seq", "type", "data", "schema_version", "at", "prev_hash", "hash"}
    assert rows[1]["prev_hash"] == rows[0]["hash"]
    assert verify([Event(**r) for r in rows]).ok  # an export can be checked away from the store


def test_verify_says_ok_or_names_the_first_bad_seq(capsys, state_dir):
    code, out, _ = ringfence(capsys, "runs", "verify", "r1", "--state-dir", str(state_dir))
    assert (code, out) == (0, "ok: 3 events, chain intact\n")
    raw = sqlite3.connect(state_dir / "events.sqlite3", isolation_level=None)
    try:
        raw.execute("DROP TRIGGER events_append_only_u")
        raw.execute("""UPDATE events SET data = '{"outcome":"cancelled","reason":""}'"""
                    """ WHERE run_id = 'r1' AND seq = 3""")
    finally:
        raw.close()
    code, out, _ = ringfence(capsys, "runs", "verify", "r1", "--state-dir", str(state_dir))
    assert code == 1 and "first bad seq 3" in out and "edited" in out


def test_an_unknown_run_is_a_clear_error(capsys, state_dir):
    code, out, err = ringfence(capsys, "runs", "show", "nope", "--state-dir", str(state_dir))
    assert code == 1 and out == "" and "no run 'nope'" in err
    # The caller's id of a namespaced run: the message points at the stored key.
    code, _, err = ringfence(capsys, "runs", "verify", "live/x", "--state-dir", str(state_dir))
    assert code == 1
    code, out, _ = ringfence(capsys, "runs", "verify", "globex/r1", "--state-dir", str(state_dir))
    assert (code, out) == (0, "ok: 1 events, chain intact\n")


def test_a_namespaced_key_is_suggested(capsys, tmp_path):
    d = tmp_path / "state"
    s = SqliteEventStore(d / "events.sqlite3")
    try:
        s.append("globex/r9", "run_started", {"tenant": "globex"})
    finally:
        s.close()
    code, _, err = ringfence(capsys, "runs", "show", "r9", "--state-dir", str(d))
    assert code == 1 and "globex/r9" in err


def test_prune_removes_old_finished_runs_and_says_so(capsys, state_dir):
    code, out, err = ringfence(capsys, "runs", "prune", "--older-than", "30d", "--state-dir", str(state_dir))
    assert code == 0, err
    assert out.splitlines() == ["pruned r1", "pruned 1 finished run older than 30d"]
    code, out, _ = ringfence(capsys, "runs", "prune", "--older-than", "12h", "--state-dir", str(state_dir))
    assert (code, out) == (0, "nothing to prune: no finished run older than 12h\n")
    code, _, _ = ringfence(capsys, "runs", "show", "live", "--state-dir", str(state_dir))
    assert code == 0


@pytest.mark.parametrize("bad", ["30", "1y", "-1d", "d", ""])
def test_a_bad_duration_is_a_usage_error(capsys, state_dir, bad):
    with pytest.raises(SystemExit) as exc:
        main(["runs", "prune", f"--older-than={bad}", "--state-dir", str(state_dir)])
    assert exc.value.code == 2
    assert "duration" in capsys.readouterr().err


def test_a_missing_log_is_not_created(capsys, tmp_path):
    code, _, err = ringfence(capsys, "runs", "show", "r1", "--state-dir", str(tmp_path / "typo"))
    assert code == 1 and "there is no event log" in err
    assert not (tmp_path / "typo").exists()


def test_the_default_state_dir_is_serves(capsys, tmp_path, monkeypatch):
    s = SqliteEventStore(tmp_path / ".state" / "events.sqlite3")
    try:
        s.append("r1", "run_started", {"tenant": "acme"})
    finally:
        s.close()
    monkeypatch.chdir(tmp_path)
    code, out, _ = ringfence(capsys, "runs", "verify", "r1")
    assert (code, out) == (0, "ok: 1 events, chain intact\n")


def test_database_url_chooses_postgres(capsys, pg_url):
    store = open_store(pg_url, clock=lambda: OLD)
    try:
        _fill(store)
    finally:
        store.close()
    code, out, _ = ringfence(capsys, "runs", "verify", "r1", "--database-url", pg_url)
    assert (code, out) == (0, "ok: 3 events, chain intact\n")
    code, out, _ = ringfence(capsys, "runs", "show", "globex/r1", "--database-url", pg_url)
    assert code == 0 and "tenant globex" in out
    code, out, _ = ringfence(capsys, "runs", "prune", "--older-than", "1d", "--database-url", pg_url)
    assert code == 0 and out.splitlines()[0] == "pruned r1"
    code, _, err = ringfence(capsys, "runs", "show", "r1", "--database-url", pg_url)
    assert code == 1 and "no run 'r1'" in err


def test_an_unreachable_database_is_a_clear_error(capsys):
    # Port 1 on loopback: nothing listens there.
    code, out, err = ringfence(capsys, "runs", "verify", "r1", "--database-url", "postgresql://postgres@127.0.0.1:1/x")
    assert code == 1 and out == "" and "cannot open the event store database" in err


def test_database_url_must_be_postgres_and_alone(capsys, tmp_path):
    code, _, err = ringfence(capsys, "runs", "show", "r1", "--database-url", "mysql://x")
    assert code == 2 and "postgresql://" in err
    code, _, err = ringfence(capsys, "runs", "show", "r1", "--database-url", "postgresql://x/y",
                             "--state-dir", str(tmp_path))
    assert code == 2 and "alone" in err


def test_help_explains_each_action(capsys):
    for action in ("show", "export", "verify", "prune"):
        with pytest.raises(SystemExit):
            main(["runs", action, "--help"])
        out = capsys.readouterr().out
        assert "--state-dir" in out and "--database-url" in out
        if action != "prune":
            assert "TENANT/RUN_ID" in out
