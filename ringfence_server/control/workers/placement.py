"""Which attached worker runs a call: pure (no I/O, no clock, no locks).

`place` reads what each worker advertised in its hello (WorkerCapacity) and what it is running
now, and chooses in this order:

1. able     the worker's engine holds the call's image by ID, has its runtime, and runs an
            egress proxy when the call has an egress grant: a worker never receives a call it
            would have to refuse (it checks all of it again itself, admission's image and
            runtime checks, whatever a control plane believed)
2. labels   every label the call asks for has the same value on the worker
3. free     it has a free slot (running < slots)
4. least    of those, the least loaded (running / slots), then the one given work least
            recently (spreads a burst over equal workers), then the id (a stable order)

None when no worker qualifies: the caller waits for one to attach or free a slot, up to its
placement timeout, and then fails the call as not started (it may be retried).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

__all__ = ["Advertised", "Need", "WorkerLoad", "able", "place"]


@dataclass(frozen=True)
class Advertised:
    """A worker's capacity as it said in its hello."""

    slots: int
    cpus: float
    runtimes: frozenset[str]
    image_digests: frozenset[str]
    egress: bool
    labels: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Need:
    """What a call needs of a worker."""

    image_digest: str
    runtime: str
    egress: bool
    labels: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class WorkerLoad:
    """One attached worker as placement sees it."""

    worker_id: str
    advertised: Advertised
    running: int
    last_placed: int
    """A counter value (higher: given work more recently), not a time."""


def able(need: Need, advertised: Advertised) -> bool:
    """Steps 1 and 2: the worker could run the call at all."""
    if need.image_digest not in advertised.image_digests or need.runtime not in advertised.runtimes:
        return False
    if need.egress and not advertised.egress:
        return False
    return all(advertised.labels.get(k) == v for k, v in need.labels.items())


def place(need: Need, workers: Iterable[WorkerLoad]) -> str | None:
    """The worker to run the call (steps 1-4), or None."""
    candidates = [w for w in workers if able(need, w.advertised) and w.running < w.advertised.slots]
    if not candidates:
        return None
    best = min(candidates, key=lambda w: (w.running / w.advertised.slots, w.last_placed, w.worker_id))
    return best.worker_id
