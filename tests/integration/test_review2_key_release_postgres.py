"""Second attack review, finding 6, on PostgreSQL: a client key whose calls never reached a
container is released and claimed again under its next generation's store key, on a real
PostgreSQL server (the SQLite run of the same scenario is tests/unit/test_review2_dispatch_outcomes.py)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))

from control_support import Harness
from test_review2_dispatch_outcomes import released_key_runs_once


def test_a_released_client_key_is_claimed_again_on_postgres(tmp_path, pg_url):
    h = Harness(tmp_path, store_url=pg_url, limits={"breaker_threshold": 50})
    try:
        released_key_runs_once(h)
    finally:
        h.close()
