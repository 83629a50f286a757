"""`ringfence demo --console`: the reference demo with a person as its approver.

The scripted approver steps aside; the reviewer's console (ringfence_server.console) is served
beside the demo's control plane, and the agent waits for decisions made in a browser: sign in
with the demo's public approver token, open each request, approve or decline. The console is
one more client of the control plane's gRPC API, exactly as `ringfence console` would be.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TextIO

from ringfence.model import Approval

__all__ = ["HUMAN_WAIT_S", "PersonApproves", "checked_listen", "person_approves"]

HUMAN_WAIT_S = 900.0
"""How long the agent waits for a person's decision on each request (a scripted one takes ms)."""


@dataclass
class PersonApproves:
    """What stands where the scripted approver's helper stood: the decisions are the person's,
    made in the console, so none are made (or failed) here."""

    url: str
    decided: list[Approval] = field(default_factory=list)
    errors: list[BaseException] = field(default_factory=list)


def checked_listen(listen: str) -> tuple[str, int]:
    """--console's HOST:PORT, on loopback only (the demo's tokens are public); ListenRefused
    (the console's ValueError) otherwise, before the demo starts anything."""
    from ringfence_server.console.server import ListenRefused, parse_host_port
    from ringfence_server.control.netloc import is_loopback_host

    host, port = parse_host_port(listen, "--console")
    if not is_loopback_host(host):
        raise ListenRefused(f"--console {listen}: the demo's approver token is public; listen on 127.0.0.1")
    return host, port


@contextlib.contextmanager
def person_approves(server: str, listen: str, token: str, out: TextIO) -> Iterator[PersonApproves]:
    """The console for the control plane at `server`, on `listen` (checked_listen's rule), until
    the block ends."""
    from ringfence_server.console.app import ConsoleSettings, create_app
    from ringfence_server.console.server import ConsoleServer, ListenRefused

    host, port = checked_listen(listen)
    try:
        console = ConsoleServer(create_app(ConsoleSettings(server=server)), host, port)
    except OSError as e:
        raise ListenRefused(f"--console: cannot listen on {listen}: {e}") from None
    console.start_in_thread()
    try:
        print(f"console         {console.url}/  sign in with the approver token {token}; each request waits "
              f"for your decision (up to {HUMAN_WAIT_S / 60:g} min)\n", file=out, flush=True)
        yield PersonApproves(console.url)
    finally:
        console.stop()
