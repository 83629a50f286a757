"""The backend's remover thread outlives a removal that fails unexpectedly: every later container
is still removed (a KeyError from an os.environ race once ended it, and the rest stayed behind)."""

from __future__ import annotations

from types import SimpleNamespace

from ringfence_server.sandbox.removal import Remover


def test_an_unexpected_error_does_not_stop_the_removals():
    removed: list[str] = []
    failures = {"a": 1, "b": 2}  # a fails once (retried), b fails twice (left to the reaper)

    def remove(container):
        if failures.get(container.id, 0) > 0:
            failures[container.id] -= 1
            raise KeyError("HTTP_PROXY")  # what os.environ raised mid-iteration
        removed.append(container.id)

    remover = Remover(remove)
    for name in ("a", "b", "c"):
        remover.later(SimpleNamespace(id=name))
    remover.close()  # drains the queue before the thread ends
    assert removed == ["a", "c"]


def test_close_removes_what_waits_for_its_grace_at_once():
    """A removal waits its grace (the call's reply goes first); close() does not wait for it."""
    removed: list[str] = []
    remover = Remover(lambda c: removed.append(c.id), grace_s=3600)
    remover.later(SimpleNamespace(id="a"))
    remover.close(timeout_s=30)
    assert removed == ["a"]
