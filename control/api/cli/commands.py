"""The commands this package owns, added to `ringfence`'s parser (control/cli.py says where in the
list each group goes).

`register_runs` is apart because `ringfence --help` lists `runs` among the commands that read
local state (before `serve`), and the others after `serve`.
"""

from __future__ import annotations

from control.api.cli import approvals, files, runs, submit, tools
from control.api.cli.options import SubParsers, connection_options


def register(subparsers: SubParsers) -> None:
    """submit, watch, files, approvals, run and tools, in the order `ringfence --help` lists them."""
    common = connection_options()
    submit.register(subparsers, common)
    files.register(subparsers, common)
    approvals.register(subparsers, common)
    runs.register_run(subparsers, common)
    tools.register(subparsers, common)


def register_runs(subparsers: SubParsers) -> None:
    """`runs`: over gRPC with no action, the event store's actions composed under it."""
    runs.register_runs(subparsers, connection_options())
