"""The sign-in throttle: failed sign-ins are limited per client address and across all of them.

Without it the sign-in form is an oracle for guessing bearer tokens at whatever rate the network
allows, and every guess costs the control plane an RPC. With it:

- an address that failed `failures` times within `window_s` is refused (HTTP 429, Retry-After)
  until the oldest of those failures is `window_s` old - and a refused attempt never reaches the
  control plane, whatever token it carries (a right token included: else the refusal itself
  would tell a right guess from a wrong one);
- all addresses together may fail at most `global_failures` times per `global_window_s`: many
  addresses (a botnet, an IPv6 /64) cannot multiply the rate, and behind a reverse proxy, where
  every request has the proxy's address, this cap is the one that protects.

Every attempt is admitted as a failure *before* the control plane is asked (`admit`), and only
a success takes it back (`succeeded`): checking and counting are one step, so a burst of
concurrent requests cannot all pass the check before the first of them has failed.

A success takes back that attempt only; it does not wipe the address's earlier failures. Else
an attacker holding one valid token (their own) could sign in after every few guesses and guess
without limit from one address.

Memory is bounded: at most `failures` timestamps per address, `max_addresses` addresses (the
least recently failed is forgotten first) and `global_failures` timestamps in all. A flood of
addresses can make the table forget an address early, but the global cap still holds then.

Pure apart from its clock (injected: the tests move time by hand); the console runs it on its
one event loop, so it needs no lock.
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["Admitted", "Refused", "SignInThrottle", "ThrottleSettings"]


@dataclass(frozen=True)
class ThrottleSettings:
    failures: int = 5
    """Failed sign-ins one address may make within `window_s`; the next attempt is refused."""
    window_s: float = 300.0
    """The per-address window, in seconds: a failure older than this no longer counts."""
    global_failures: int = 60
    """Failed sign-ins all addresses together may make within `global_window_s`."""
    global_window_s: float = 60.0
    """The global window, in seconds."""
    max_addresses: int = 10_000
    """Addresses remembered at once; beyond it the least recently failed one is forgotten."""

    def __post_init__(self) -> None:
        if self.failures < 1 or self.global_failures < 1 or self.max_addresses < 1:
            raise ValueError("the sign-in limits want whole numbers of at least 1")
        if not self.window_s > 0 or not self.global_window_s > 0:
            raise ValueError("the sign-in windows want a number of seconds above 0")


@dataclass(frozen=True)
class Admitted:
    """The attempt may go to the control plane; it counts as a failure until `succeeded`."""

    address: str
    """The client address it was admitted for."""
    at: float
    """When (the throttle's clock): the timestamp `succeeded` takes back."""


@dataclass(frozen=True)
class Refused:
    """The attempt is refused without asking the control plane."""

    retry_after_s: int
    """Whole seconds (at least 1) until an attempt would be admitted again: the Retry-After."""
    everyone: bool
    """True: the global cap (all addresses); False: this address's own limit."""

    @property
    def message(self) -> str:
        """What the person is shown (plain text)."""
        if self.everyone:
            return (f"Too many failed sign-ins to this console from all addresses; "
                    f"try again in {self.retry_after_s} s")
        return f"Too many failed sign-ins from this address; try again in {self.retry_after_s} s"


class SignInThrottle:
    """Failed sign-ins by address and in all, each a sliding window of failure timestamps."""

    def __init__(self, settings: ThrottleSettings | None = None, *,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.settings = settings or ThrottleSettings()
        self._clock = clock
        # address -> its last `failures` failure times, oldest first; the dict in the order the
        # addresses last failed (the first is the one to forget when full).
        self._by_address: OrderedDict[str, deque[float]] = OrderedDict()
        # the last `global_failures` failure times of all addresses, oldest first
        self._all: deque[float] = deque(maxlen=self.settings.global_failures)

    def admit(self, address: str) -> Admitted | Refused:
        """Admit an attempt from `address` (and count it as failed until `succeeded`), or refuse it."""
        s = self.settings
        now = self._clock()
        mine = self._by_address.get(address)
        if mine is not None and len(mine) >= s.failures and now - mine[0] < s.window_s:
            return Refused(_whole_seconds(mine[0] + s.window_s - now), everyone=False)
        if len(self._all) >= s.global_failures and now - self._all[0] < s.global_window_s:
            return Refused(_whole_seconds(self._all[0] + s.global_window_s - now), everyone=True)
        if mine is None:
            while len(self._by_address) >= s.max_addresses:
                self._by_address.popitem(last=False)
            mine = self._by_address[address] = deque(maxlen=s.failures)
        mine.append(now)  # maxlen: the oldest falls out, only the last `failures` ever matter
        self._by_address.move_to_end(address)
        self._all.append(now)
        return Admitted(address, now)

    def succeeded(self, attempt: Admitted) -> None:
        """The attempt signed in (or never got an answer about its token): it is not a failure."""
        _take_back(self._all, attempt.at)
        mine = self._by_address.get(attempt.address)
        if mine is not None:
            _take_back(mine, attempt.at)
            if not mine:
                del self._by_address[attempt.address]

    def __len__(self) -> int:
        """Addresses remembered now."""
        return len(self._by_address)


def _take_back(times: deque[float], at: float) -> None:
    # The newest matching timestamp: the attempt's own (an older equal one is another attempt's
    # made at the same clock reading, equally fine to remove). Gone already (pushed out by later
    # failures): nothing to take back.
    for i in range(len(times) - 1, -1, -1):
        if times[i] == at:
            del times[i]
            return


def _whole_seconds(seconds: float) -> int:
    return max(1, math.ceil(seconds))
