"""Fixtures of the engine farm (tests/engine_farm.py): several real Docker engines, one per
sandbox-worker host a test needs. tests/conftest.py imports them, as it does pg_support's.

- `engine_farm` (session): three engines holding every pinned image by ID, shared by the tests
  of the whole session (a farm costs a few seconds to start and fill).
- `start_engine_farm(count, ...)`: a farm of a test's own (a context manager), for a test that
  must stop or break one.

Before the first farm of a session starts, the farms of earlier sessions that were killed before
their teardown are removed (`reap_leftover_farms`); those of sessions still running are not.
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, NoReturn

import pytest
from engine_farm import DEFAULT_BASE, EngineFarm, reap_leftover_farms

REQUIRE = os.environ.get("RINGFENCE_REQUIRE_DOCKER") == "1"
FARM_SIZE = 3
_reaped = False


def _unavailable(reason: str) -> NoReturn:
    # As tests/conftest.py: in CI a missing part is a failure, never a silent skip.
    if REQUIRE:
        pytest.fail(reason, pytrace=False)
    pytest.skip(reason)


def _session() -> str:
    # conftest.py sets it when it is imported (after this module): read it when a farm starts.
    return os.environ.get("RINGFENCE_TEST_SESSION") or uuid.uuid4().hex[:12]


def _check_host() -> None:
    if os.geteuid() != 0:
        _unavailable("an engine farm starts dockerd processes, which needs root")
    missing = [t for t in ("dockerd", "containerd", "nsenter", "ip") if shutil.which(t) is None]
    if missing:
        _unavailable(f"an engine farm needs {', '.join(missing)} (Debian: docker.io, util-linux, iproute2)")


@contextmanager
def start_engine_farm(count: int, images: Sequence[str] = (), **options: Any) -> Iterator[EngineFarm]:
    """A farm of `count` engines holding `images` (IDs or lock names) under DEFAULT_BASE, removed
    when the block ends. `options` are EngineFarm's (runsc, dockerd_args, start_timeout_s, ...)."""
    global _reaped
    _check_host()
    if not _reaped:
        _reaped = True
        reap_leftover_farms(DEFAULT_BASE)
    # The session in the folder's name: `ls /tmp/ringfence-engine-farm` tells whose farm is whose.
    farm_id = f"{_session()}-{uuid.uuid4().hex[:6]}"
    with EngineFarm(count, DEFAULT_BASE / farm_id, images=images, farm_id=farm_id, **options) as farm:
        yield farm


@pytest.fixture(scope="session")
def engine_farm(pinned_images) -> Iterator[EngineFarm]:
    """Three engines, each with every image of images/images.lock loaded by ID."""
    with start_engine_farm(FARM_SIZE, images=sorted(pinned_images.ids())) as farm:
        yield farm
