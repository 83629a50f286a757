"""Agent memory (ringfence.memory) on real SQLite files: recall, tenancy, provenance,
corrections, real deletion, durability, and the Retriever seam."""

from __future__ import annotations

import ast
import threading
from collections.abc import Sequence
from pathlib import Path

import pytest

from ringfence.errors import FailedPrecondition, InvalidArgument, NotFound
from ringfence.memory import (
    MAX_TEXT_CHARS,
    Fact,
    KeywordRetriever,
    MemoryKind,
    MemoryStore,
    Provenance,
    SqliteMemoryStore,
    TenantMemory,
)

RAN = Provenance(run_id="run-1", call_id="c1", executed=True, source="tool:read_file")
DENIED = Provenance(run_id="run-1", call_id="c2", executed=False, source="tool:http_get")
USER = Provenance(run_id="run-2", call_id=None, executed=True, source="user")


class Clock:
    """A clock that ticks one second per reading: creation order is recall's tie-breaker."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        self.now += 1.0
        return self.now


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "memory.sqlite"


@pytest.fixture
def store(db_path: Path):
    with SqliteMemoryStore(db_path, clock=Clock()) as s:
        yield s


def texts(facts: Sequence[Fact]) -> list[str]:
    return [f.text for f in facts]


# --- remember / recall ------------------------------------------------------------------------


def test_remember_returns_the_stored_fact(store):
    fact = store.remember("acme", MemoryKind.SEMANTIC, "The billing API lives at /v2", RAN)
    assert fact.tenant == "acme" and fact.kind is MemoryKind.SEMANTIC
    assert fact.text == "The billing API lives at /v2"
    assert fact.provenance == RAN
    assert fact.supersedes is None and fact.superseded_by is None
    assert store.get("acme", fact.id) == fact


@pytest.mark.parametrize("kind", list(MemoryKind))
def test_recall_by_keyword_per_kind(store, kind):
    for k in MemoryKind:
        store.remember("acme", k, f"note about deploying in {k.value} memory", RAN)
    got = store.recall("acme", "deploying", kinds=[kind])
    assert [f.kind for f in got] == [kind]
    # A kind may be named by its string value too; a bare string is one kind, not its letters.
    assert store.recall("acme", "deploying", kinds=kind.value) == got


def test_recall_without_kinds_searches_all_kinds(store):
    for k in MemoryKind:
        store.remember("acme", k, f"deploy note {k.value}", RAN)
    assert {f.kind for f in store.recall("acme", "deploy", limit=10)} == set(MemoryKind)


def test_ranking_counts_distinct_query_words_then_newest_first(store):
    one = store.remember("acme", MemoryKind.SEMANTIC, "the database is postgres", RAN)
    two = store.remember("acme", MemoryKind.SEMANTIC, "postgres database backups run nightly", RAN)
    older_one_word = store.remember("acme", MemoryKind.SEMANTIC, "backups are encrypted", RAN)
    newer_one_word = store.remember("acme", MemoryKind.SEMANTIC, "Backups, BACKUPS, backups!", RAN)
    got = store.recall("acme", "postgres BACKUPS nightly", limit=10)
    # two: 3 words; then one-word facts newest first (repeats of a word count once).
    assert [f.id for f in got] == [two.id, newer_one_word.id, older_one_word.id, one.id]


def test_limit_caps_the_result(store):
    for i in range(8):
        store.remember("acme", MemoryKind.EPISODIC, f"run {i} touched the cache", RAN)
    got = store.recall("acme", "cache", limit=3)
    assert texts(got) == ["run 7 touched the cache", "run 6 touched the cache", "run 5 touched the cache"]


def test_zero_score_facts_are_never_returned(store):
    store.remember("acme", MemoryKind.SEMANTIC, "the sky is blue", RAN)
    assert store.recall("acme", "kubernetes") == []
    assert store.recall("acme", "") == []
    assert store.recall("acme", "!!! ???") == []
    # Word tokens, not substrings: "sky" does not match "skyline".
    assert store.recall("acme", "skyline") == []


def test_keyword_retriever_alone():
    r = KeywordRetriever()

    def mk(i: int, t: str, at: float) -> Fact:
        return Fact(f"f{i}", "t", MemoryKind.SEMANTIC, t, RAN, at, None, None)

    facts = [mk(1, "alpha beta", 5.0), mk(2, "alpha", 9.0), mk(3, "gamma", 10.0)]
    assert [f.id for f in r.rank("alpha beta", facts, 5)] == ["f1", "f2"]
    assert [f.id for f in r.rank("alpha", facts, 5)] == ["f2", "f1"]
    assert r.rank("alpha", facts, 0) == []


# --- tenancy ----------------------------------------------------------------------------------


def test_cross_tenant_probe_returns_zero_hits(store):
    secret = store.remember("tenant-a", MemoryKind.SEMANTIC, "zanzibar quokka passphrase", RAN)
    store.remember("tenant-a", MemoryKind.PROCEDURAL, "to unlock the quokka vault say zanzibar", RAN)
    probe = "zanzibar quokka passphrase vault unlock"

    # B asks for A's words: nothing, whatever the filters.
    assert store.recall("tenant-b", probe) == []
    assert store.recall("tenant-b", probe, include_superseded=True, limit=100) == []
    assert store.recall("tenant-b", probe, kinds=list(MemoryKind)) == []
    assert store.facts("tenant-b") == []
    assert store.for_tenant("tenant-b").recall(probe) == []

    # B naming A's id: as if it did not exist.
    assert store.get("tenant-b", secret.id) is None
    with pytest.raises(NotFound):
        store.correct("tenant-b", secret.id, "overwritten by b", USER)
    assert store.forget("tenant-b", secret.id) is False

    # A's fact is untouched, and still A's to recall.
    assert store.get("tenant-a", secret.id) == secret
    assert secret.id in [f.id for f in store.recall("tenant-a", probe)]
    assert len(store.facts("tenant-a")) == 2


def test_tenant_view_binds_the_tenant(store):
    a = store.for_tenant("a")
    b = store.for_tenant("b")
    assert isinstance(a, TenantMemory)
    f = a.remember(MemoryKind.WORKING, "scratch: try the mirror", RAN)
    assert a.get(f.id) == f and b.get(f.id) is None
    assert texts(a.recall("mirror")) == ["scratch: try the mirror"] and b.recall("mirror") == []
    new = a.correct(f.id, "scratch: the mirror is down", RAN)
    assert texts(a.recall("mirror")) == ["scratch: the mirror is down"]
    assert [x.id for x in a.facts(kinds=[MemoryKind.WORKING])] == [f.id, new.id]
    assert texts(a.recall("mirror", include_superseded=True)) == [
        "scratch: the mirror is down",
        "scratch: try the mirror",
    ]
    assert b.forget(new.id) is False and a.forget(new.id) is True


def test_a_retriever_cannot_widen_the_candidate_set(db_path):
    smuggled = Fact("fact-elsewhere", "other", MemoryKind.SEMANTIC, "smuggled", RAN, 1.0, None, None)

    class Leaky:
        def rank(self, query, facts, limit):
            return [smuggled, *facts, *facts]

    with SqliteMemoryStore(db_path, retriever=Leaky(), clock=Clock()) as s:
        f = s.remember("t", MemoryKind.SEMANTIC, "real", RAN)
        assert s.recall("t", "anything") == [f]


# --- provenance -------------------------------------------------------------------------------


def test_provenance_round_trips(store, db_path):
    a = store.remember("acme", MemoryKind.EPISODIC, "the http call returned 403", DENIED)
    b = store.remember("acme", MemoryKind.SEMANTIC, "the user prefers yaml", USER)
    store.close()
    with SqliteMemoryStore(db_path) as again:
        assert again.get("acme", a.id).provenance == DENIED
        assert again.get("acme", a.id).provenance.executed is False
        assert again.get("acme", b.id).provenance == Provenance("run-2", None, True, "user")


def test_recall_executed_only_leaves_out_unexecuted_results(store):
    store.remember("acme", MemoryKind.EPISODIC, "the deploy endpoint returned ok", DENIED)
    ran = store.remember("acme", MemoryKind.EPISODIC, "the deploy endpoint returned 500", RAN)
    assert len(store.recall("acme", "deploy endpoint")) == 2
    assert store.recall("acme", "deploy endpoint", executed_only=True) == [ran]


# --- corrections ------------------------------------------------------------------------------


def test_correction_supersedes_the_old_fact(store):
    old = store.remember("acme", MemoryKind.SEMANTIC, "the api port is 8080", RAN)
    new = store.correct("acme", old.id, "the api port is 9090", USER)
    assert new.supersedes == old.id and new.kind is MemoryKind.SEMANTIC and new.provenance == USER

    assert texts(store.recall("acme", "api port")) == ["the api port is 9090"]
    both = store.recall("acme", "api port", include_superseded=True)
    assert [f.id for f in both] == [new.id, old.id]

    kept = store.get("acme", old.id)
    assert kept.superseded_by == new.id and kept.text == "the api port is 8080"
    assert [f.id for f in store.facts("acme")] == [old.id, new.id]  # history, oldest first


def test_correcting_a_superseded_fact_is_refused(store):
    old = store.remember("acme", MemoryKind.SEMANTIC, "v1", RAN)
    new = store.correct("acme", old.id, "v2", RAN)
    with pytest.raises(FailedPrecondition):
        store.correct("acme", old.id, "v2 bis", RAN)
    assert [f.text for f in store.facts("acme")] == ["v1", "v2"]
    newest = store.correct("acme", new.id, "v3", RAN)  # the head of the chain can be corrected
    assert store.get("acme", new.id).superseded_by == newest.id


def test_correcting_an_unknown_fact_is_not_found(store):
    with pytest.raises(NotFound):
        store.correct("acme", "fact-nope", "x", RAN)


# --- deletion ---------------------------------------------------------------------------------


def test_forget_really_deletes(db_path):
    marker = "PELICAN-7f3a-secret-" + "x" * 600  # long enough to be unmistakable in the file
    keep = "keeper fact remains"
    with SqliteMemoryStore(db_path, clock=Clock()) as s:
        gone = s.remember("acme", MemoryKind.SEMANTIC, marker, RAN)
        kept = s.remember("acme", MemoryKind.SEMANTIC, keep, RAN)
        s.remember("acme", MemoryKind.SEMANTIC, "short PELICAN-7f3a-short", RAN)
        short = s.recall("acme", "short")[0]
    assert marker.encode() in db_path.read_bytes()  # the check below can see text at all

    with SqliteMemoryStore(db_path, clock=Clock()) as s:
        assert s.forget("acme", gone.id) is True
        assert s.forget("acme", short.id) is True
        assert s.get("acme", gone.id) is None
        assert s.forget("acme", gone.id) is False  # the second time: nothing to forget
        assert s.get("acme", kept.id) == kept
    raw = db_path.read_bytes()
    assert b"PELICAN-7f3a" not in raw
    assert keep.encode() in raw


def test_forgetting_a_correction_does_not_revive_the_old_fact(store):
    old = store.remember("acme", MemoryKind.SEMANTIC, "the port is 1", RAN)
    new = store.correct("acme", old.id, "the port is 2", RAN)
    assert store.forget("acme", new.id) is True
    assert store.recall("acme", "port") == []
    assert store.get("acme", old.id).superseded_by == new.id


# --- durability, validation, lifecycle --------------------------------------------------------


def test_reopening_the_file_keeps_facts(db_path):
    with SqliteMemoryStore(db_path, clock=Clock()) as s:
        a = s.remember("acme", MemoryKind.PROCEDURAL, "to release: test, then tag", RAN)
        b = s.correct("acme", a.id, "to release: test, tag, then announce", RAN)
    with SqliteMemoryStore(db_path, clock=Clock(5000.0)) as s:
        assert s.facts("acme") == [s.get("acme", a.id), b]
        assert s.get("acme", a.id).superseded_by == b.id
        assert s.recall("acme", "release") == [b]


@pytest.mark.parametrize(
    "call, field",
    [
        (lambda s: s.remember("acme", MemoryKind.SEMANTIC, "", RAN), "text"),
        (lambda s: s.remember("acme", MemoryKind.SEMANTIC, "   ", RAN), "text"),
        (lambda s: s.remember("acme", MemoryKind.SEMANTIC, "x" * (MAX_TEXT_CHARS + 1), RAN), "text"),
        (lambda s: s.remember("acme", "gossip", "x", RAN), "kind"),
        (lambda s: s.remember("", MemoryKind.SEMANTIC, "x", RAN), "tenant"),
        (lambda s: s.remember("acme", MemoryKind.SEMANTIC, "x", None), "provenance"),
        (lambda s: s.recall("", "x"), "tenant"),
        (lambda s: s.recall("acme", "x", kinds=["semantic", "gossip"]), "kinds[1]"),
        (lambda s: s.recall("acme", "x", limit=0), "limit"),
        (lambda s: s.correct("acme", "fact-x", "", RAN), "text"),
        (lambda s: s.get("", "fact-x"), "tenant"),
        (lambda s: s.forget("", "fact-x"), "tenant"),
        (lambda s: s.facts("acme", kinds=["gossip"]), "kinds[0]"),
        (lambda s: s.for_tenant(""), "tenant"),
    ],
)
def test_validation_names_the_field(store, call, field):
    with pytest.raises(InvalidArgument) as err:
        call(store)
    assert field in [v.field for v in err.value.violations]


def test_text_at_the_limit_is_accepted(store):
    f = store.remember("acme", "semantic", "y" * MAX_TEXT_CHARS, RAN)
    assert f.kind is MemoryKind.SEMANTIC and len(store.get("acme", f.id).text) == MAX_TEXT_CHARS


def test_several_violations_are_listed_together(store):
    with pytest.raises(InvalidArgument) as err:
        store.remember("", "gossip", "", RAN)
    assert {v.field for v in err.value.violations} == {"tenant", "kind", "text"}


def test_closed_store_refuses(db_path):
    s = SqliteMemoryStore(db_path)
    s.close()
    s.close()  # idempotent
    with pytest.raises(FailedPrecondition):
        s.recall("acme", "x")


def test_threads_share_one_store(store):
    def work(n: int) -> None:
        for i in range(20):
            store.remember(f"t{n % 2}", MemoryKind.WORKING, f"thread {n} note {i} widget", RAN)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(store.facts("t0")) == 60 and len(store.facts("t1")) == 60
    assert len(store.recall("t0", "widget", limit=100)) == 60


# --- the Retriever seam -----------------------------------------------------------------------


def test_a_custom_retriever_is_used(db_path):
    seen: list[tuple[str, list[str], int]] = []

    class OldestFirst:
        def rank(self, query: str, facts: Sequence[Fact], limit: int) -> list[Fact]:
            seen.append((query, [f.text for f in facts], limit))
            return sorted(facts, key=lambda f: f.created_at)[:limit]

    with SqliteMemoryStore(db_path, retriever=OldestFirst(), clock=Clock()) as s:
        s.remember("acme", MemoryKind.SEMANTIC, "first", RAN)
        s.remember("acme", MemoryKind.SEMANTIC, "second", RAN)
        s.remember("acme", MemoryKind.PROCEDURAL, "third", RAN)
        s.remember("other", MemoryKind.SEMANTIC, "foreign", RAN)
        # No keyword overlap at all, yet the custom ranking answers.
        assert texts(s.recall("acme", "zzz", kinds=[MemoryKind.SEMANTIC], limit=1)) == ["first"]
    # Pre-filtered by tenant and kind in SQL, newest first, with the limit passed through.
    assert seen == [("zzz", ["second", "first"], 1)]


def test_the_sqlite_store_satisfies_the_protocol(store):
    def takes(m: MemoryStore) -> MemoryStore:
        return m

    assert takes(store) is store


def test_the_module_imports_only_the_stdlib_and_the_clients_errors_or_model():
    import sys

    path = Path(__file__).resolve().parents[2] / "client" / "ringfence" / "memory.py"
    tree = ast.parse(path.read_text())
    imported: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module)
    for name in imported:
        top = name.split(".")[0]
        assert top in sys.stdlib_module_names or name in {"ringfence.errors", "ringfence.model"}, name
