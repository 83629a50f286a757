"""Placement of calls on attached workers (ringfence_server.control.workers.placement): pure, so
every step of its documented order is checked on plain values."""

from __future__ import annotations

import itertools

from ringfence_server.control.workers.placement import Advertised, Need, WorkerLoad, able, place

IMG = "sha256:" + "1" * 64
OTHER = "sha256:" + "2" * 64


def adv(slots: int = 2, runtimes: tuple[str, ...] = ("runc",), images: tuple[str, ...] = (IMG,), egress: bool = False,
        labels: dict[str, str] | None = None) -> Advertised:
    return Advertised(slots=slots, cpus=2.0, runtimes=frozenset(runtimes), image_digests=frozenset(images),
                      egress=egress, labels=labels or {})


def load(worker_id: str, advertised: Advertised, running: int = 0, last: int = 0) -> WorkerLoad:
    return WorkerLoad(worker_id, advertised, running, last)


NEED = Need(image_digest=IMG, runtime="runc", egress=False)


def test_a_worker_without_the_image_runtime_or_egress_is_never_chosen():
    assert not able(Need(OTHER, "runc", False), adv())
    assert not able(Need(IMG, "gvisor", False), adv())
    assert not able(Need(IMG, "runc", True), adv())
    assert able(Need(IMG, "gvisor", True), adv(runtimes=("runc", "gvisor"), egress=True))
    only_wrong = [load("a", adv(images=(OTHER,))), load("b", adv(runtimes=("gvisor",)))]
    assert place(NEED, only_wrong) is None


def test_labels_asked_for_must_match_exactly():
    need = Need(IMG, "runc", False, labels={"zone": "b"})
    workers = [load("a", adv(labels={"zone": "a"})), load("b", adv(labels={"zone": "b", "pool": "x"}))]
    assert place(need, workers) == "b"
    assert place(Need(IMG, "runc", False, labels={"zone": "c"}), workers) is None


def test_a_full_worker_is_skipped_and_none_when_all_are_full():
    workers = [load("a", adv(slots=1), running=1), load("b", adv(slots=2), running=1)]
    assert place(NEED, workers) == "b"
    assert place(NEED, [load("a", adv(slots=1), running=1)]) is None


def test_the_least_loaded_then_least_recently_given_work_then_the_id():
    assert place(NEED, [load("a", adv(slots=4), running=2), load("b", adv(slots=2), running=0)]) == "b"
    assert place(NEED, [load("a", adv(), last=5), load("b", adv(), last=3)]) == "b"
    assert place(NEED, [load("b", adv()), load("a", adv())]) == "a"


def test_a_burst_spreads_evenly_over_equal_workers():
    # Simulate the registry: each placement takes a slot and is the most recent.
    ticks = itertools.count(1)
    state = {w: [0, 0] for w in ("w1", "w2", "w3")}
    counts = dict.fromkeys(state, 0)
    for _ in range(30):
        chosen = place(NEED, [load(w, adv(slots=100), running=r, last=t) for w, (r, t) in state.items()])
        assert chosen is not None
        state[chosen] = [state[chosen][0] + 1, next(ticks)]
        counts[chosen] += 1
    assert counts == {"w1": 10, "w2": 10, "w3": 10}
