"""`ringfence runs show|export|verify|prune`: look at, export, verify and prune the runs in an event
store (the actions; `runs` itself is ringfence.cli.runs's, which adds them with add_actions).

Reads the store directly (no server needed): the SQLite log in a state directory, as `ringfence
serve` writes it, or a PostgreSQL database. Exit codes: 0 done (for verify: the chain is
intact), 1 an unknown run, a broken chain or an unusable store, 2 bad arguments or config.
"""

from __future__ import annotations

import argparse
import datetime as dt
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ringfence.errors import ConfigError
from ringfence.model import Event
from ringfence_server.control.config import load_config
from ringfence_server.control.state import fold
from ringfence_server.control.store import SQLITE_FILENAME, StoreError, is_database_url, open_store
from ringfence_server.control.store.audit import canonical_json, verify
from ringfence_server.control.store.base import EventStore

StoreAction = Callable[[argparse.Namespace, EventStore, str], int]
"""A subcommand's body: (its arguments, the open store, where the store is, for messages) -> exit code."""

_DURATION = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
KEYS_NOTE = (
    "RUN_ID is the run's key in the store: normally the run id a client used, but a run created "
    "while another tenant already had a run with the same id is stored as TENANT/RUN_ID."
)


class StoreCommandError(Exception):
    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


def parse_duration(text: str) -> float:
    """'30d', '12h', '90m', '45s', '2w' (a number and one unit) -> seconds."""
    m = _DURATION.fullmatch(text)
    if not m:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration: a number and a unit, e.g. 30d, 12h, 90m, 45s")
    return float(m.group(1)) * _UNIT_S[m.group(2)]


def store_options() -> argparse.ArgumentParser:
    """The options that say which store to read (a parent parser): also `ringfence trace`'s."""
    common = argparse.ArgumentParser(add_help=False)
    where = common.add_argument_group("which store")
    where.add_argument("--state-dir", type=Path, default=None,
                       help="directory holding the SQLite event log events.sqlite3 (default: the config's "
                            "state_dir, as for `ringfence serve`: ./.state)")
    where.add_argument("--config", type=Path, default=None,
                       help="ringfence.toml whose state_dir to use (as `ringfence serve --config`)")
    where.add_argument("--database-url", default=None, metavar="URL",
                       help="a PostgreSQL store instead: postgresql://user@host:port/dbname")
    return common


DESCRIPTION = ("Inspect the event store directly: one run's events, its audit hash chain, and retention of "
               "finished runs. " + KEYS_NOTE)
"""What the store's actions are for: the store's part of `ringfence runs --help` (ringfence.cli.runs)."""


def add_actions(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> dict[str, argparse.ArgumentParser]:
    """Add show, export, verify and prune to `sub` (the actions of `ringfence runs`, whose owner,
    ringfence.cli.runs, composes them with its own); return each action's parser by name."""
    common = store_options()

    show = sub.add_parser("show", parents=[common], help="a run's state and its events, one per line",
                          description="Print a run's tenant, status and outcome (the fold of its events), "
                                      "whether its hash chain is intact, and every event: seq, time (UTC), "
                                      "type, data. " + KEYS_NOTE)
    show.add_argument("run_id", metavar="RUN_ID")
    show.set_defaults(func=_show)

    export = sub.add_parser("export", parents=[common], help="a run's events as JSON lines, with their hashes",
                            description="Write a run's events to stdout, one JSON object per line in seq "
                                        "order: run_id, seq, type, data, schema_version, at, prev_hash, hash. "
                                        + KEYS_NOTE)
    export.add_argument("run_id", metavar="RUN_ID")
    export.set_defaults(func=_export)

    verify = sub.add_parser("verify", parents=[common], help="check a run's audit hash chain",
                            description="Recompute a run's hash chain. Exit 0 and 'ok: N events, chain intact' "
                                        "when every event links to its predecessor and matches its hash; exit 1 "
                                        "with the first bad seq and why (an edited, dropped, reordered event or a "
                                        "forged hash) otherwise. A cut-off tail can only be seen against a head "
                                        "hash recorded elsewhere. " + KEYS_NOTE)
    verify.add_argument("run_id", metavar="RUN_ID")
    verify.set_defaults(func=_verify)

    prune = sub.add_parser("prune", parents=[common], help="delete finished runs older than a duration",
                           description="Remove every run whose last event is run_finished and was appended more "
                                       "than DURATION ago, with its lease; live runs are never removed. Prints "
                                       "the key of each run it removed.")
    prune.add_argument("--older-than", required=True, type=parse_duration, metavar="DURATION",
                       help="a number and a unit: s, m, h, d or w (e.g. 30d, 12h)")
    prune.set_defaults(func=_prune)
    return {"show": show, "export": export, "verify": verify, "prune": prune}


def run_on_store(args: argparse.Namespace, action: StoreAction) -> int:
    store = None
    try:
        store, where = _open(args)
        return action(args, store, where)
    except StoreCommandError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.code
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except (StoreError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except Exception as e:  # sqlite3/psycopg errors: report them, do not trace back
        if type(e).__module__.split(".")[0] in ("sqlite3", "psycopg", "psycopg_pool"):
            print(f"error: the event store failed: {e}", file=sys.stderr)
            return 1
        raise
    finally:
        if store is not None:
            store.close()


def _open(args: argparse.Namespace) -> tuple[EventStore, str]:
    if args.database_url is not None:
        if args.state_dir is not None or args.config is not None:
            raise StoreCommandError("--database-url goes alone: not with --state-dir or --config", 2)
        if not is_database_url(args.database_url):
            raise StoreCommandError("--database-url must start with postgresql:// (or postgres://)", 2)
        # The URL may carry a password: never echo it back.
        return open_store(args.database_url), "the PostgreSQL store"
    state_dir = args.state_dir
    if state_dir is None:
        state_dir = load_config(args.config).state_dir
    path = Path(state_dir) / SQLITE_FILENAME
    if not path.is_file():
        # Opening would create an empty log there: a typo must not look like "no runs".
        raise StoreCommandError(
            f"there is no event log at {path} (choose one with --state-dir, --config or --database-url)")
    return open_store(path), str(path)


def run_events(store: EventStore, run_id: str, where: str) -> list[Event]:
    events = store.read(run_id)
    if events:
        return events
    hint = ""
    namespaced = [key for _tenant, key in store.all_runs() if key.endswith("/" + run_id)]
    if namespaced:
        hint = f"; runs stored under a tenant-namespaced key: {', '.join(namespaced)}"
    raise StoreCommandError(f"no run {run_id!r} in {where}{hint}. RUN_ID is the key as stored (TENANT/RUN_ID when "
                "another tenant had already used the id)")


def _when(at: float) -> str:
    return dt.datetime.fromtimestamp(at, dt.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _show(args: argparse.Namespace) -> int:
    return run_on_store(args, _do_show)


def _do_show(args: argparse.Namespace, store: EventStore, where: str) -> int:
    events = run_events(store, args.run_id, where)
    try:
        state = fold(events)
        status = str(state.status) + (f" ({state.outcome})" if state.outcome else "")
    except Exception as e:  # noqa: BLE001 - a log this version cannot fold is still worth showing
        status = f"unknown (the events do not fold: {e})"
    report = verify(events)
    chain = "intact" if report.ok else f"BROKEN at seq {report.first_bad_seq}: {report.problem}"
    print(f"run {args.run_id}  tenant {store.tenant_of(args.run_id)}  events {len(events)}  status {status}")
    print(f"chain {chain}  head {events[-1].hash or '-'}")
    for event in events:
        data = canonical_json(event.data)
        if len(data) > 160:
            data = data[:157] + "..."
        print(f"{event.seq:>5}  {_when(event.at)}  {event.type:<20} {data}")
    return 0


def _export(args: argparse.Namespace) -> int:
    return run_on_store(args, _do_export)


def _do_export(args: argparse.Namespace, store: EventStore, where: str) -> int:
    for e in run_events(store, args.run_id, where):
        line: dict[str, Any] = {"run_id": e.run_id, "seq": e.seq, "type": e.type, "data": e.data,
                                "schema_version": e.schema_version, "at": e.at, "prev_hash": e.prev_hash,
                                "hash": e.hash}
        sys.stdout.write(canonical_json(line) + "\n")
    return 0


def _verify(args: argparse.Namespace) -> int:
    return run_on_store(args, _do_verify)


def _do_verify(args: argparse.Namespace, store: EventStore, where: str) -> int:
    report = verify(run_events(store, args.run_id, where))
    if report.ok:
        print(f"ok: {report.events} events, chain intact")
        return 0
    print(f"broken: run {args.run_id}, first bad seq {report.first_bad_seq}: {report.problem}")
    return 1


def _prune(args: argparse.Namespace) -> int:
    return run_on_store(args, _do_prune)


def _do_prune(args: argparse.Namespace, store: EventStore, where: str) -> int:
    removed = store.prune(args.older_than)
    for run_id in removed:
        print(f"pruned {run_id}")
    age = _age(args.older_than)
    if removed:
        print(f"pruned {len(removed)} finished run{'s' if len(removed) != 1 else ''} older than {age}")
    else:
        print(f"nothing to prune: no finished run older than {age}")
    return 0


def _age(seconds: float) -> str:
    for unit in ("w", "d", "h", "m"):
        if seconds >= _UNIT_S[unit] and seconds % _UNIT_S[unit] == 0:
            return f"{int(seconds // _UNIT_S[unit])}{unit}"
    return f"{seconds:g}s"
