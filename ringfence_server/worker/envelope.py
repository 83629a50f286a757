"""Work envelopes: one admitted call, as a control plane hands it to a sandbox worker, signed.

A worker holds no database, no tenant tokens and no approval authority (docs/workers.md): what
it runs is exactly what an envelope says, so an envelope must be something only a control plane
can make. A control plane `seal`s each envelope with its Ed25519 key; a worker `open_sealed`s it
against the public keys it trusts and refuses everything it cannot verify.

The bytes that are signed (`signed_message`):

    DOMAIN                          b"ringfence/work-envelope\\0": a signature over anything else
                                    (another protocol's message signed with the same key) never
                                    verifies as an envelope, nor the other way round
    version                         4 bytes, big-endian: FORMAT_VERSION
    len(key_id) key_id              8-byte big-endian length, then the UTF-8 key id
    len(payload) payload            8-byte big-endian length, then the payload

and the payload is `encode(envelope)`: canonical JSON (sorted keys, no whitespace, UTF-8, no NaN)
of every field by name, with the format and version inside too. Every field is in the signed
bytes under its own name, each part is length-prefixed, and `decode` accepts only the exact
canonical form (`encode(decode(p)) == p`, every key present, every type exact), so a signature
cannot be moved to another envelope and no field can be read as another.

The envelope names the worker it was placed on (`worker_id`, signed like the rest); whether that
is this worker is admission's check (ringfence_server.worker.admission), not this module's: an
envelope opens the same on every worker, and only the worker knows its own id.

`open_sealed` checks in this order, the first failure raising EnvelopeRefused with its reason:

1. wrong_version   the sealed envelope's format version is not FORMAT_VERSION (nothing else of it
                   can be read by this code; version 1, before `worker_id`, and version 2, before
                   `attempt`, included)
2. unsigned        no signature
3. unknown_key     its key id is not one of the trusted keys
4. bad_signature   the signature does not verify over `signed_message` with that key
5. malformed       the (now authenticated) payload is not a canonical envelope, or names another
                   version or key id than the sealed envelope it came in
6. expired         its deadline has passed

Nothing of the payload is parsed before the signature verifies (1-4 read only the framing), so a
forger learns nothing from the reason but that the envelope is not authentic; and the deadline
of an unverified envelope means nothing, so it is checked last.
"""

from __future__ import annotations

import enum
import hashlib
import json
import math
import re
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from ringfence_server.control.validation import canonical_json
from ringfence_server.sandbox.egress.grant import EgressGrant
from ringfence_server.sandbox.errors import ProfileError
from ringfence_server.sandbox.profile import LIMIT_RANGES, RUNTIMES
from ringfence_server.worker import keys
from ringfence_server.worker.errors import WorkerError
from ringfence_server.worker.keys import KEY_ID_HEX, TrustedKeys

__all__ = [
    "DOMAIN",
    "FORMAT",
    "FORMAT_VERSION",
    "MAX_ATTEMPT",
    "MAX_PAYLOAD_BYTES",
    "Envelope",
    "EnvelopeRefused",
    "GrantedEgress",
    "LogicalKey",
    "Refusal",
    "SandboxSpec",
    "SealedEnvelope",
    "decode",
    "encode",
    "open_sealed",
    "seal",
    "signed_message",
]

FORMAT = "ringfence/work-envelope"
FORMAT_VERSION = 3
"""Raised for any change to the fields or their encoding: a worker refuses a version it does not
know (wrong_version) rather than reading it as the one it does. Version 2 added `worker_id` (the
envelope names the worker it was placed on); version 3 added `attempt` (which attempt of the call
this is: a result is keyed by one attempt of one call). Versions 1 and 2 are refused as
wrong_version, and there is nothing to stay compatible with: no worker of either was ever deployed
(nothing ran the worker package before version 3's executor)."""
DOMAIN = FORMAT.encode("ascii") + b"\0"
MAX_ATTEMPT = 1_000_000
"""An attempt number at most: far past any retry policy (the control plane's allows 10 attempts
per dispatch), and it bounds the sandbox call id `{call_id}.a{attempt}` the worker derives."""
MAX_PAYLOAD_BYTES = 8 * 1024 * 1024
"""An envelope's payload at most: the arguments are capped far below this by the control plane
(max_argument_bytes); a bigger one is refused before it is verified or parsed."""

_WORKSPACE_MODES = ("read", "write")
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
_KEY_ID = re.compile(rf"[0-9a-f]{{{KEY_ID_HEX}}}")
# W3C trace context, version 00: the control plane's span the worker's spans are children of.
_TRACEPARENT = re.compile(r"00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_MAX_NAME = 256
_MAGIC = b"RFWE"
# The profile's ceilings that are fractional (the rest are counts of bytes or tasks).
_FLOAT_LIMITS = ("cpus", "timeout_s")


class Refusal(enum.StrEnum):
    """Why an envelope was refused (EnvelopeRefused.reason); the order is open_sealed's."""

    WRONG_VERSION = "wrong_version"
    UNSIGNED = "unsigned"
    UNKNOWN_KEY = "unknown_key"
    BAD_SIGNATURE = "bad_signature"
    MALFORMED = "malformed"
    EXPIRED = "expired"


class EnvelopeRefused(WorkerError):
    """An envelope this layer will not hand on: the one exception of ringfence_server.worker.envelope.
    `reason` is machine-readable (a worker reports it and counts it); the message is for people."""

    def __init__(self, reason: Refusal, detail: str = "") -> None:
        super().__init__(f"{reason.value}: {detail}" if detail else reason.value)
        self.reason = reason
        self.detail = detail


def _wrong_version(version: int) -> EnvelopeRefused:
    return EnvelopeRefused(Refusal.WRONG_VERSION, f"format version {version}, this worker reads {FORMAT_VERSION}")


# -- the values ------------------------------------------------------------------------------


def _name(field_name: str, value: object) -> str:
    """An identifier-like text: non-empty, at most _MAX_NAME characters, no control characters."""
    if not isinstance(value, str) or not value or len(value) > _MAX_NAME or _CONTROL.search(value):
        raise ValueError(f"{field_name}: must be 1-{_MAX_NAME} characters without control characters")
    return value


def _number(field_name: str, value: object) -> float:
    """A finite float (an int is taken as its float: one spelling per value, so one encoding)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{field_name}: must be a finite number")
    return float(value)


def _integer(field_name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{field_name}: must be an integer")
    return value


@dataclass(frozen=True)
class LogicalKey:
    """What a result is keyed by: one attempt of one logical call, never its delivery. Two
    deliveries of one attempt (a redelivery, another control plane's re-issue with a new envelope
    id and deadline) share it, so a worker runs the tool once and answers the second with the
    first's result. A retry is a new attempt, so a new key: the control plane retries a read that
    failed (on this worker or another), and the retry must run, not be answered with the failure."""

    tenant: str
    run_id: str
    call_id: str
    attempt: int
    """The attempt's number, from 1 (Envelope.attempt)."""


@dataclass(frozen=True)
class SandboxSpec:
    """The sandbox profile a call runs with, as plain values: what the control plane's
    `Dispatcher.profile` decides from the tool's manifest, less what only means something on the
    control plane's host (the image's name: the worker runs the envelope's digest; input folders'
    host paths: the worker maps `input_roots` to its own). Validated against the sandbox's own
    ranges, so a worker never builds a profile its sandbox would refuse."""

    runtime: str = "runc"
    """"runc" or "gvisor" (ringfence_server.sandbox.profile.RUNTIMES)."""
    memory_bytes: int = 128 * 1024 * 1024
    """Memory limit (swap equal: no swapping past it)."""
    cpus: float = 0.5
    """CPU quota in cores."""
    pids: int = 64
    """Tasks (processes and threads) at most."""
    timeout_s: float = 10.0
    """Wall time from start to kill."""
    stdout_limit: int = 1024 * 1024
    """Bytes of stdout kept; past it the call is killed (`output_limit`)."""
    stderr_limit: int = 64 * 1024
    """Bytes of stderr kept; the same."""
    workspace: str | None = None
    """"read" or "write": the run's workspace (on this worker: a run's calls are placed on the
    worker that holds its workspace) at /workspace, read-only or read-write; None: no workspace."""
    input_roots: tuple[str, ...] = ()
    """Container roots the tool reads files under (its manifest's `paths`), sorted; the worker
    mounts its own folder for each, read-only, or none."""
    warm: bool = True
    """May run in a warm container of the worker's pool; False: a container made for this call."""

    def __post_init__(self) -> None:
        if self.runtime not in RUNTIMES:
            raise ValueError(f"profile.runtime: {self.runtime!r} is not one of {', '.join(RUNTIMES)}")
        for name, (low, high) in LIMIT_RANGES.items():
            value = getattr(self, name)
            if name in _FLOAT_LIMITS:
                value = _number(f"profile.{name}", value)
                object.__setattr__(self, name, value)
            else:
                _integer(f"profile.{name}", value)
            if not low <= value <= high:
                raise ValueError(f"profile.{name}: {value} is outside [{low}, {high}]")
        if self.workspace is not None and self.workspace not in _WORKSPACE_MODES:
            raise ValueError(f"profile.workspace: {self.workspace!r} is not read, write or None")
        roots = tuple(self.input_roots)
        if any(not isinstance(r, str) or not r.startswith("/") or _CONTROL.search(r) for r in roots):
            raise ValueError("profile.input_roots: absolute container paths")
        if list(roots) != sorted(set(roots)):
            raise ValueError("profile.input_roots: sorted, each once (one spelling, one encoding)")
        object.__setattr__(self, "input_roots", roots)
        if not isinstance(self.warm, bool):
            raise ValueError("profile.warm: must be a bool")


@dataclass(frozen=True)
class GrantedEgress:
    """The hosts this call may reach through the worker's egress proxy, and its ceilings: the
    intersection of the tool's declared hosts and policy's grant, decided by the control plane
    (ringfence_server.sandbox.egress.grant.EgressGrant is the sandbox's form of it)."""

    allow: tuple[str, ...]
    """Host patterns `name[:port]` / `*.suffix[:port]`, in EgressGrant's canonical form (sorted)."""
    max_bytes: int = 64 * 1024 * 1024
    """Bytes up plus down over all of the call's connections."""
    max_connections: int = 32
    """Connections the call may open in total."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "allow", tuple(self.allow))
        try:
            grant = self.to_grant()
        except ProfileError as e:
            raise ValueError(str(e)) from None
        if grant.allow != self.allow:
            # One spelling per grant: what is signed is exactly what the proxy will enforce.
            raise ValueError(f"egress.allow: not in canonical form (expected {list(grant.allow)})")

    def to_grant(self) -> EgressGrant:
        """The sandbox's EgressGrant (raises ProfileError if the sandbox would refuse it)."""
        return EgressGrant(allow=self.allow, max_bytes=self.max_bytes, max_connections=self.max_connections)


@dataclass(frozen=True)
class Envelope:
    """One admitted call for a worker to run. Every field is signed (see the module's docstring);
    a new field is a new FORMAT_VERSION."""

    envelope_id: str
    """This delivery's id ("env-" + random hex): two deliveries of one call have two."""
    issued_at: float
    """When the control plane sealed it (unix seconds)."""
    key_id: str
    """The id of the control plane key that signs it ("" until `seal` sets it)."""
    worker_id: str
    """The worker the call was placed on (since format version 2): any other worker refuses it
    (admission's `wrong_worker`), so a captured envelope cannot be run once by every worker that
    trusts the key. Signed like every field; not part of `call_digest` (placing the same call on
    another worker is another delivery of it, not another call)."""
    run_id: str
    """The run the call belongs to."""
    call_id: str
    """The call's id in its run (the control plane's, as in its log): the logical call, the id the
    tool sees in its request whichever attempt this is."""
    attempt: int
    """Which attempt of the call this is, from 1 (since format version 3): the control plane runs
    a failed read again as attempt 2, 3, ..., each its own sandbox call (`{call_id}.a{attempt}`, as
    on the control plane's own engine) and its own logical key, so a retry runs and a redelivery
    of one attempt does not. Part of `call_digest` too (it is part of the key anyway)."""
    idempotency_key: str | None
    """The key a mutating call carries to its receiver (ringfence_server.control.idempotency); None for
    a read."""
    traceparent: str
    """The W3C traceparent of the control plane's span for this call ("" when untraced): the
    worker's spans are its children."""
    deadline: float
    """Absolute (unix seconds): past it the call must not start; a result after it is late."""
    tenant: str
    """The tenant the run belongs to."""
    tool: str
    """The tool's registered name."""
    arguments_json: str
    """The call's arguments as the control plane canonicalized them
    (ringfence_server.control.validation.canonical_json of a JSON object): the bytes the approval
    digest and the idempotency key were computed from."""
    image_digest: str
    """The image to run, by content: "sha256:" + 64 hex (the pinned image ID)."""
    profile: SandboxSpec
    """The sandbox the call runs in."""
    egress: GrantedEgress | None
    """The call's way out, or None: no network at all."""

    def __post_init__(self) -> None:
        for name in ("envelope_id", "worker_id", "run_id", "call_id", "tenant", "tool"):
            _name(name, getattr(self, name))
        if self.idempotency_key is not None:
            _name("idempotency_key", self.idempotency_key)
        if not 1 <= _integer("attempt", self.attempt) <= MAX_ATTEMPT:
            raise ValueError(f"attempt: from 1 to {MAX_ATTEMPT}")
        object.__setattr__(self, "issued_at", _number("issued_at", self.issued_at))
        object.__setattr__(self, "deadline", _number("deadline", self.deadline))
        if self.deadline <= self.issued_at:
            raise ValueError("deadline: must be after issued_at")
        if not isinstance(self.key_id, str) or (self.key_id and not _KEY_ID.fullmatch(self.key_id)):
            raise ValueError(f"key_id: {KEY_ID_HEX} hex digits (or empty before sealing)")
        if not isinstance(self.traceparent, str) or (self.traceparent and not _TRACEPARENT.fullmatch(self.traceparent)):
            raise ValueError("traceparent: a W3C traceparent (version 00) or empty")
        if not isinstance(self.image_digest, str) or not _DIGEST.fullmatch(self.image_digest):
            raise ValueError("image_digest: sha256: and 64 lower-case hex digits")
        _check_arguments(self.arguments_json)
        if not isinstance(self.profile, SandboxSpec):
            raise ValueError("profile: must be a SandboxSpec")
        if self.egress is not None:
            if not isinstance(self.egress, GrantedEgress):
                raise ValueError("egress: must be a GrantedEgress or None")
            if self.profile.runtime == "gvisor":
                # As the sandbox's profile says: gVisor here cannot reach the proxy's socket.
                raise ValueError("egress: egress calls run on runc")

    @classmethod
    def for_call(cls, *, worker_id: str, run_id: str, call_id: str, attempt: int, tenant: str, tool: str,
                 arguments: Mapping[str, Any], image_digest: str, profile: SandboxSpec, deadline: float, now: float,
                 idempotency_key: str | None = None, traceparent: str = "",
                 egress: GrantedEgress | None = None) -> Envelope:
        """A new envelope for attempt `attempt` of one call placed on `worker_id`: a fresh envelope
        id, issued `now`, its arguments in the control plane's canonical form (raises ValueError for
        arguments that are not JSON). `attempt` has no default: the control plane says which."""
        return cls(envelope_id="env-" + uuid.uuid4().hex, issued_at=now, key_id="", worker_id=worker_id,
                   run_id=run_id, call_id=call_id, attempt=attempt, idempotency_key=idempotency_key,
                   traceparent=traceparent,
                   deadline=deadline, tenant=tenant, tool=tool, arguments_json=canonical_json(dict(arguments)),
                   image_digest=image_digest, profile=profile, egress=egress)

    @property
    def logical_key(self) -> LogicalKey:
        return LogicalKey(self.tenant, self.run_id, self.call_id, self.attempt)

    def arguments(self) -> dict[str, Any]:
        """The arguments as a fresh dict (the tool's input)."""
        value: dict[str, Any] = json.loads(self.arguments_json)
        return value

    @property
    def call_digest(self) -> str:
        """sha256 hex of what makes the call this call (everything but the delivery: envelope id,
        issued_at, key id, worker id, traceparent, deadline). A second delivery of the logical call with
        another digest is another call under a reused id, and is never answered with the first's
        result."""
        doc = _to_json(self)
        for name in ("envelope_id", "issued_at", "key_id", "worker_id", "traceparent", "deadline"):
            del doc[name]
        return hashlib.sha256(_canonical_bytes(doc)).hexdigest()


def _check_arguments(text: object) -> None:
    if not isinstance(text, str):
        raise ValueError("arguments_json: must be a str")
    try:
        value = json.loads(text)
        again = canonical_json(value)
    except ValueError as e:  # json.JSONDecodeError is a ValueError; so is canonical's refusal
        raise ValueError(f"arguments_json: not canonical JSON ({e})") from None
    if not isinstance(value, dict):
        raise ValueError("arguments_json: must be a JSON object")
    if again != text:
        raise ValueError("arguments_json: not in the control plane's canonical form")


# -- the encoding ------------------------------------------------------------------------------


def _canonical_bytes(doc: Mapping[str, Any]) -> bytes:
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      allow_nan=False).encode("utf-8")


def _to_json(envelope: Envelope) -> dict[str, Any]:
    doc: dict[str, Any] = {"format": FORMAT, "version": FORMAT_VERSION}
    for f in fields(envelope):
        value = getattr(envelope, f.name)
        if isinstance(value, (SandboxSpec, GrantedEgress)):
            value = {g.name: _plain(getattr(value, g.name)) for g in fields(value)}
        doc[f.name] = value
    return doc


def _plain(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


def encode(envelope: Envelope) -> bytes:
    """The canonical payload of `envelope`: the same envelope gives the same bytes, always."""
    return _canonical_bytes(_to_json(envelope))


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    doc = dict(pairs)
    if len(doc) != len(pairs):
        raise ValueError("a key appears twice")
    return doc


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _exact_keys(where: str, doc: object, names: set[str]) -> dict[str, Any]:
    if not isinstance(doc, dict):
        raise ValueError(f"{where}: must be an object")
    if set(doc) != names:
        raise ValueError(f"{where}: keys {sorted(set(doc) ^ names)} missing or unknown")
    return doc


def _checked(where: str, value: Any, accept: Callable[[Any], bool]) -> Any:
    if not accept(value):
        raise ValueError(f"{where}: wrong type ({type(value).__name__})")
    return value


def _is_str(v: Any) -> bool:
    return isinstance(v, str)


def _is_opt_str(v: Any) -> bool:
    return v is None or isinstance(v, str)


def _is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_str_list(v: Any) -> bool:
    return isinstance(v, list) and all(isinstance(x, str) for x in v)


# Each field's JSON type: a decoded value of another type is malformed, never coerced.
_ENVELOPE_TYPES: dict[str, Callable[[Any], bool]] = {
    "envelope_id": _is_str, "issued_at": _is_num, "key_id": _is_str, "worker_id": _is_str, "run_id": _is_str,
    "call_id": _is_str, "attempt": _is_int,
    "idempotency_key": _is_opt_str, "traceparent": _is_str, "deadline": _is_num, "tenant": _is_str,
    "tool": _is_str, "arguments_json": _is_str, "image_digest": _is_str,
}
_PROFILE_TYPES: dict[str, Callable[[Any], bool]] = {
    "runtime": _is_str, "memory_bytes": _is_int, "cpus": _is_num, "pids": _is_int, "timeout_s": _is_num,
    "stdout_limit": _is_int, "stderr_limit": _is_int, "workspace": _is_opt_str, "input_roots": _is_str_list,
    "warm": lambda v: isinstance(v, bool),
}
_EGRESS_TYPES: dict[str, Callable[[Any], bool]] = {
    "allow": _is_str_list, "max_bytes": _is_int, "max_connections": _is_int,
}


def _decode(payload: bytes) -> Envelope:
    doc = json.loads(payload.decode("utf-8"), object_pairs_hook=_no_duplicates, parse_constant=_no_constant)
    doc = _exact_keys("envelope", doc, {"format", "version", "profile", "egress", *_ENVELOPE_TYPES})
    if doc["format"] != FORMAT or doc["version"] != FORMAT_VERSION or isinstance(doc["version"], bool):
        raise ValueError("format or version: not this format's")
    values = {name: _checked(name, doc[name], ok) for name, ok in _ENVELOPE_TYPES.items()}
    p = _exact_keys("profile", doc["profile"], set(_PROFILE_TYPES))
    profile = SandboxSpec(**{n: _checked(f"profile.{n}", p[n], ok) for n, ok in _PROFILE_TYPES.items()})
    egress = None
    if doc["egress"] is not None:
        e = _exact_keys("egress", doc["egress"], set(_EGRESS_TYPES))
        egress = GrantedEgress(**{n: _checked(f"egress.{n}", e[n], ok) for n, ok in _EGRESS_TYPES.items()})
    envelope = Envelope(**values, profile=profile, egress=egress)
    if encode(envelope) != payload:
        # Whitespace, key order, 1 for 1.0, an escaped character: one envelope, one spelling.
        raise ValueError("not in canonical form")
    return envelope


def decode(payload: bytes) -> Envelope:
    """The envelope whose canonical payload is exactly `payload` (EnvelopeRefused malformed
    otherwise). Call it only on verified bytes: open_sealed does."""
    if len(payload) > MAX_PAYLOAD_BYTES:
        raise EnvelopeRefused(Refusal.MALFORMED, f"payload over {MAX_PAYLOAD_BYTES} bytes")
    try:
        return _decode(payload)
    except (ValueError, TypeError, RecursionError) as e:  # UnicodeDecodeError is a ValueError
        raise EnvelopeRefused(Refusal.MALFORMED, str(e)[:300]) from None


# -- sealing and opening -----------------------------------------------------------------------


@dataclass(frozen=True)
class SealedEnvelope:
    """An envelope as it travels: its payload and the control plane's signature over it."""

    version: int
    """FORMAT_VERSION of the payload's encoding (signed too)."""
    key_id: str
    """The id of the key that signed it (signed too: the payload names the same id)."""
    payload: bytes
    """`encode(envelope)`."""
    signature: bytes
    """Ed25519 over `signed_message(version, key_id, payload)`; empty: unsigned."""

    def to_bytes(self) -> bytes:
        """One framing for transports that carry bytes: magic, then each part length-prefixed."""
        kid = self.key_id.encode("utf-8")
        return b"".join((_MAGIC, self.version.to_bytes(4, "big"), len(kid).to_bytes(2, "big"), kid,
                         len(self.payload).to_bytes(8, "big"), self.payload,
                         len(self.signature).to_bytes(2, "big"), self.signature))

    @classmethod
    def from_bytes(cls, data: bytes) -> SealedEnvelope:
        """The sealed envelope framed in `data` (EnvelopeRefused: malformed framing, or
        wrong_version when the framing is of a version this code cannot read)."""
        if data[:4] != _MAGIC or len(data) < 8:
            raise EnvelopeRefused(Refusal.MALFORMED, "not a sealed work envelope")
        version = int.from_bytes(data[4:8], "big")
        if version != FORMAT_VERSION:
            raise _wrong_version(version)
        at = 8
        parts: list[bytes] = []
        for width, cap in ((2, 256), (8, MAX_PAYLOAD_BYTES), (2, 256)):
            n = int.from_bytes(data[at:at + width], "big")
            at += width
            if at > len(data) or n > cap or at + n > len(data):
                raise EnvelopeRefused(Refusal.MALFORMED, "truncated or oversized part")
            parts.append(data[at:at + n])
            at += n
        if at != len(data):
            raise EnvelopeRefused(Refusal.MALFORMED, "trailing bytes")
        try:
            kid = parts[0].decode("utf-8")
        except UnicodeDecodeError:
            raise EnvelopeRefused(Refusal.MALFORMED, "key id is not UTF-8") from None
        return cls(version=version, key_id=kid, payload=parts[1], signature=parts[2])


def signed_message(version: int, key_id: str, payload: bytes) -> bytes:
    """The exact bytes a signature covers (see the module's docstring)."""
    k = key_id.encode("utf-8")
    return b"".join((DOMAIN, version.to_bytes(4, "big"), len(k).to_bytes(8, "big"), k,
                     len(payload).to_bytes(8, "big"), payload))


def seal(envelope: Envelope, private_key: Ed25519PrivateKey, key_id: str | None = None) -> SealedEnvelope:
    """Sign `envelope` as the control plane holding `private_key`. The envelope's key id is set to
    the key's own (`key_id`, when given, must be it: an envelope is never sealed under another
    key's name)."""
    own = keys.key_id(private_key.public_key())
    if key_id is not None and key_id != own:
        raise ValueError(f"key id {key_id!r} is not the id of this private key ({own})")
    sealed = replace(envelope, key_id=own)
    payload = encode(sealed)
    if len(payload) > MAX_PAYLOAD_BYTES:
        raise ValueError(f"the envelope's payload is over {MAX_PAYLOAD_BYTES} bytes")
    signature = private_key.sign(signed_message(FORMAT_VERSION, own, payload))
    return SealedEnvelope(version=FORMAT_VERSION, key_id=own, payload=payload, signature=signature)


def _verify(public_key: Ed25519PublicKey, signature: bytes, message: bytes) -> None:
    """Raise InvalidSignature unless `signature` is `public_key`'s over `message`. Its own function:
    the one step the red checks (tests/unit/test_worker_envelope.py) switch off to show that the
    tests fail without it."""
    public_key.verify(signature, message)


def open_sealed(sealed: SealedEnvelope, trusted_keys: TrustedKeys, now: float) -> Envelope:
    """The envelope `sealed` carries, once it is verified to come unchanged from a trusted control
    plane and its deadline has not passed (`now`: unix seconds); EnvelopeRefused otherwise, in
    the order of the module's docstring."""
    if sealed.version != FORMAT_VERSION:
        raise _wrong_version(sealed.version)
    if not sealed.signature:
        raise EnvelopeRefused(Refusal.UNSIGNED, "the envelope carries no signature")
    public_key = trusted_keys.get(sealed.key_id)
    if public_key is None:
        raise EnvelopeRefused(Refusal.UNKNOWN_KEY, f"key {sealed.key_id[:64]!r} is not trusted here")
    if len(sealed.payload) > MAX_PAYLOAD_BYTES:
        raise EnvelopeRefused(Refusal.MALFORMED, f"payload over {MAX_PAYLOAD_BYTES} bytes")
    try:
        _verify(public_key, sealed.signature, signed_message(sealed.version, sealed.key_id, sealed.payload))
    except InvalidSignature:
        raise EnvelopeRefused(Refusal.BAD_SIGNATURE, "the signature does not verify") from None
    envelope = decode(sealed.payload)
    if envelope.key_id != sealed.key_id:
        raise EnvelopeRefused(Refusal.MALFORMED, "the payload names another key than its seal")
    if now >= envelope.deadline:
        raise EnvelopeRefused(Refusal.EXPIRED, f"deadline passed {now - envelope.deadline:.3f}s ago")
    return envelope
