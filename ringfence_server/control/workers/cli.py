"""`ringfence workers`: the sandbox workers as the control planes' store records them, read
directly from the store (no server, no token; as `ringfence runs show`): each worker's current
lease (its epoch, the control plane holding its stream, live or lapsed) and the latest late
results (reports that arrived after their call was fenced or their run ended, never applied)."""

from __future__ import annotations

import argparse
import sys

from ringfence_server.control.store.base import EventStore
from ringfence_server.control.store.cli import run_on_store, store_options

__all__ = ["register"]

EXAMPLES = """examples:
  ringfence workers --state-dir ./.state
  ringfence workers --database-url postgresql://ringfence@db/ringfence --late 50"""


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = commands.add_parser(
        "workers", parents=[store_options()], help="the sandbox workers' leases and late results (from the store)",
        description="List each sandbox worker's lease as the control planes' store holds it (epoch, the control "
                    "plane holding its stream, live or lapsed by the store's clock) and the latest late results. "
                    "Reads the store directly, like `ringfence runs show`: no server, no token.",
        epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--late", type=int, default=20, metavar="N", help="how many late results to show (default 20)")
    p.set_defaults(func=lambda args: run_on_store(args, _show))


def _show(args: argparse.Namespace, store: EventStore, where: str) -> int:
    if not 1 <= args.late <= 10_000:
        print("error: --late must be 1 to 10000", file=sys.stderr)
        return 2
    now = store.store_now()
    leases = store.worker_leases()
    print(f"workers in {where}: {len(leases)}")
    for lease in leases:
        state = (f"live, {lease.expires_at - now:.1f} s left" if lease.expires_at > now
                 else f"lapsed {now - lease.expires_at:.0f} s ago")
        print(f"  {lease.worker_id:<20} epoch {lease.epoch:<5} {state:<24} held by {lease.holder}")
    late = store.late_results(args.late)
    print(f"late results (latest {len(late)}; reported after their call was fenced or their run ended, "
          "never applied):")
    for r in late:
        print(f"  {r.worker_id:<20} epoch {r.epoch:<5} {r.reason:<16} {r.tenant}/{r.run_id}/{r.call_id} "
              f"attempt {r.attempt}  result sha256 {r.result_sha256[:16]}…")
    return 0
