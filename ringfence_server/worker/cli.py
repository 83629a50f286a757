"""`ringfence worker`: a sandbox worker, and the two things that set one up.

    ringfence worker keygen --private KEY.pem --public PUB.pem   the control planes' signing key
    ringfence worker token ID --out FILE                         a worker's token (prints its digest)
    ringfence worker run --id ID --control-plane HOST:PORT ...   the worker itself

A worker holds no database URL, no tenant token and no approval authority: its token (which
names it alone), the control planes' public keys, its own engine and the images that engine
holds by ID. docs/workers.md has the deployment and the security model.
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import os
import re
import secrets
import signal
import stat
import sys
import textwrap
import threading
from pathlib import Path

__all__ = ["WORKER_ID", "read_token", "register"]

WORKER_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
"""A worker's id: the names of [workers] tokens (ringfence_server.control.config checks the same)."""

log = logging.getLogger("ringfence.worker")

DESCRIPTION = """A sandbox worker runs the calls a control plane places on it, each in a fresh hardened
container on this host's own Docker engine, exactly as `ringfence serve` runs them on its own. It
dials out to the control plane (no listening port), proves who it is with its own token, and runs
only envelopes signed by a key in --trusted-keys, for images its engine holds by ID. It keeps a
durable record of every call (--state-dir), so a second delivery never runs a tool twice, and it
stops taking work and kills what it runs when it cannot renew its lease (fencing)."""

EXAMPLES = """examples (docs/workers.md has the whole two-host deployment):
  on the control plane's host:
    ringfence worker keygen --private signing-key.pem --public trusted/control-plane.pem
    ringfence worker token w1 --out w1.token      # prints: tokens.w1 = "<sha256>" for [workers]
  on the sandbox host (with trusted/ and w1.token copied over):
    ringfence worker run --id w1 --token-file w1.token --trusted-keys trusted \\
        --control-plane cp.example.internal:50051 --tls-ca ca.pem"""


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = commands.add_parser("worker", help="a sandbox worker on this host, and its keys and tokens",
                            description=textwrap.fill(" ".join(DESCRIPTION.split()), 88), epilog=EXAMPLES,
                            formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False)
    actions = p.add_subparsers(dest="worker_action", metavar="ACTION", required=True)

    keygen = actions.add_parser("keygen", help="make the control planes' envelope signing key pair",
                                description="Write a new Ed25519 key pair: the private key (mode 0600) for "
                                            "[workers] signing_key of every control plane, the public key for "
                                            "every worker's --trusted-keys folder. Never overwrites a file.")
    keygen.add_argument("--private", type=Path, required=True, metavar="KEY.pem", help="where the private key goes")
    keygen.add_argument("--public", type=Path, required=True, metavar="PUB.pem", help="where the public key goes")
    keygen.set_defaults(func=_keygen)

    token = actions.add_parser("token", help="make a worker's token and print its digest for [workers] tokens",
                               description="Write a new random token for worker ID to --out (mode 0600) and print "
                                           "the line to add under [workers] in the control planes' config. Only "
                                           "the digest goes into the config; the token goes to the worker.")
    token.add_argument("worker_id", metavar="ID", help="the worker's id (1-64 characters of [A-Za-z0-9_.-])")
    token.add_argument("--out", type=Path, required=True, metavar="FILE",
                       help="where the token goes (never overwritten)")
    token.set_defaults(func=_token)

    run = actions.add_parser("run", help="run the worker until SIGINT/SIGTERM",
                             description=textwrap.fill(" ".join(DESCRIPTION.split()), 88), epilog=EXAMPLES,
                             formatter_class=argparse.RawDescriptionHelpFormatter)
    who = run.add_argument_group("who it is and whom it trusts")
    who.add_argument("--id", required=True, dest="worker_id", metavar="ID", help="this worker's id (its token's)")
    who.add_argument("--token-file", type=Path, required=True, metavar="FILE",
                     help="its token (`ringfence worker token`); refused if group or others may read it")
    who.add_argument("--trusted-keys", type=Path, required=True, metavar="DIR",
                     help="the control planes' public keys (PEM files); a private key there is refused")
    where = run.add_argument_group("the control planes")
    where.add_argument("--control-plane", action="append", required=True, metavar="HOST:PORT", dest="addresses",
                       help="a control plane to attach to (repeat for several: tried in turn)")
    where.add_argument("--tls-ca", type=Path, metavar="CA.pem", help="reach them over TLS, trusting this CA")
    where.add_argument("--tls-cert", type=Path, metavar="CERT.pem", help="client certificate for mTLS")
    where.add_argument("--tls-key", type=Path, metavar="KEY.pem", help="the private key of --tls-cert")
    what = run.add_argument_group("what it runs")
    what.add_argument("--state-dir", type=Path, default=Path(".worker-state"), metavar="DIR",
                      help="its durable record of calls (results.sqlite3; default ./.worker-state)")
    what.add_argument("--slots", type=int, default=None, metavar="N",
                      help="calls it runs at once (default: this host's CPUs)")
    what.add_argument("--label", action="append", default=[], metavar="KEY=VALUE",
                      help="a placement label it advertises (repeat)")
    what.add_argument("--images-dir", type=Path, default=None, metavar="DIR",
                      help="a user images dir (its images.lock over the built-in one)")
    what.add_argument("--pool-size", type=int, default=2, metavar="N",
                      help="warm containers per shape when quiet (0 turns the pool off; default 2)")
    what.add_argument("--pool-max", type=int, default=8, metavar="N", help="warm containers a shape may grow to")
    what.add_argument("--egress-service", action="append", default=[], metavar="NAME=ADDR[,ADDR]",
                      help="an internal service its egress proxy may reach (as [egress] services)")
    what.add_argument("--egress-network", action="append", default=[], metavar="NETWORK",
                      help="a Docker network its egress proxy joins to reach those services")
    what.add_argument("--reap-every", type=float, default=30.0, metavar="SECONDS",
                      help="how often orphaned containers are reaped (default 30)")
    what.add_argument("--prune-after", type=float, default=86400.0, metavar="SECONDS",
                      help="forget settled calls this much older (default a day; never less than an envelope lives)")
    run.set_defaults(func=_run)


# -- keygen and token -------------------------------------------------------------------------


def _keygen(args: argparse.Namespace) -> int:
    from ringfence_server.worker import keys
    from ringfence_server.worker.errors import WorkerError

    for path in (args.private, args.public):
        if path.exists():
            print(f"error: {path} exists; not overwritten", file=sys.stderr)
            return 2
    private = keys.generate_private_key()
    try:
        keys.save_private_key(private, args.private)
        keys.save_public_key(private.public_key(), args.public)
    except (WorkerError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"key {keys.key_id(private.public_key())}: private {args.private} (for [workers] signing_key), "
          f"public {args.public} (for each worker's --trusted-keys)")
    return 0


def _token(args: argparse.Namespace) -> int:
    if not WORKER_ID.fullmatch(args.worker_id):
        print("error: a worker id is 1-64 characters of [A-Za-z0-9_.-]", file=sys.stderr)
        return 2
    token = "rfw_" + secrets.token_urlsafe(32)
    try:
        fd = os.open(args.out, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        print(f"error: {args.out} exists; not overwritten", file=sys.stderr)
        return 2
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    print(f'tokens.{args.worker_id} = "{hashlib.sha256(token.encode()).hexdigest()}"')
    return 0


def read_token(path: Path) -> str:
    """A worker's token file: refused when group or others may read it (it is the worker's only
    credential), or when empty."""
    st = path.stat()
    if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise ValueError(f"{path}: group or others may access it (chmod 600)")
    token = path.read_text().strip()
    if not token:
        raise ValueError(f"{path} is empty")
    return token


# -- run ----------------------------------------------------------------------------------------


def _run(args: argparse.Namespace) -> int:
    from ringfence_server.worker.process import WorkerOptions, run_worker

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        token = read_token(args.token_file)
        labels = dict(_pair("--label", item) for item in args.label)
        services = {name: tuple(a for a in addrs.split(",") if a) for name, addrs in
                    (_pair("--egress-service", item) for item in args.egress_service)}
        slots = args.slots if args.slots is not None else (os.cpu_count() or 1)
        if not 1 <= slots <= 1024:
            raise ValueError("--slots must be 1 to 1024")
        options = WorkerOptions(worker_id=args.worker_id, token=token, addresses=tuple(args.addresses),
                                trusted_keys=args.trusted_keys, state_dir=args.state_dir, slots=slots,
                                labels=labels, images_dir=args.images_dir, pool_size=args.pool_size,
                                pool_max=args.pool_max, egress_services=services,
                                egress_networks=tuple(args.egress_network), reap_every_s=args.reap_every,
                                prune_after_s=args.prune_after, tls_ca=args.tls_ca, tls_cert=args.tls_cert,
                                tls_key=args.tls_key)
    except (ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    return run_worker(options, stop)


def _pair(flag: str, item: str) -> tuple[str, str]:
    key, sep, value = item.partition("=")
    if not sep or not key:
        raise ValueError(f"{flag} {item!r}: KEY=VALUE")
    return key, value
