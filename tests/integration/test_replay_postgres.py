"""Replay equals live at every prefix of a rich run on PostgreSQL too (the SQLite run of the same
scenario is tests/unit/test_control_runs.py)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))

from control_support import replay_equals_live_at_every_prefix


def test_replay_equals_live_at_every_prefix_on_postgres(tmp_path, pg_url):
    replay_equals_live_at_every_prefix(tmp_path, store_url=pg_url)
