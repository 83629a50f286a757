"""Work envelopes (ringfence_server.worker.envelope) and the keys that sign them
(ringfence_server.worker.keys): the round trip, every refusal reason, tampering with every field,
and red checks that switch the signature check off to show these tests would fail without it."""

from __future__ import annotations

import dataclasses
import json
import os
import stat

import pytest
from cryptography.hazmat.primitives.asymmetric import ec
from hypothesis import given, settings
from hypothesis import strategies as st
from worker_support import CONTROL_KEY, NOW, OTHER_DIGEST, TRUSTED, envelope

from ringfence_server.control.idempotency import idempotency_key
from ringfence_server.control.validation import canonical_json
from ringfence_server.worker import envelope as envelope_mod
from ringfence_server.worker.envelope import (
    DOMAIN,
    FORMAT_VERSION,
    Envelope,
    EnvelopeRefused,
    GrantedEgress,
    Refusal,
    SandboxSpec,
    SealedEnvelope,
    decode,
    encode,
    open_sealed,
    seal,
    signed_message,
)
from ringfence_server.worker.keys import (
    KeyFileError,
    TrustedKeys,
    generate_private_key,
    key_id,
    load_private_key,
    load_public_key,
    save_private_key,
    save_public_key,
)

OWN_ID = key_id(CONTROL_KEY.public_key())


def refused(sealed: SealedEnvelope, trusted: TrustedKeys = TRUSTED, now: float = NOW) -> Refusal:
    with pytest.raises(EnvelopeRefused) as e:
        open_sealed(sealed, trusted, now)
    return e.value.reason


def signed(payload: bytes, *, version: int = FORMAT_VERSION, kid: str = OWN_ID, key=CONTROL_KEY) -> SealedEnvelope:
    """`payload` signed exactly as seal() signs, whatever it holds: a control plane that signs
    garbage, or an attacker holding a key."""
    return SealedEnvelope(version, kid, payload, key.sign(signed_message(version, kid, payload)))


# -- the round trip ----------------------------------------------------------------------------


def test_a_sealed_envelope_opens_to_the_same_envelope_through_its_wire_form():
    env = envelope()
    sealed = seal(env, CONTROL_KEY, OWN_ID)
    opened = open_sealed(SealedEnvelope.from_bytes(sealed.to_bytes()), TRUSTED, NOW)
    assert opened == dataclasses.replace(env, key_id=OWN_ID)
    assert opened.key_id == sealed.key_id == OWN_ID
    assert opened.arguments() == {"account": "ACME-1", "amount": 50, "lines": [{"n": 2, "sku": "x"}]}


def test_the_arguments_are_the_control_planes_canonical_form():
    # The exact text the approval digest and the idempotency key are computed from: the worker's
    # copy gives the same key as the control plane's.
    args = {"b": 50.0, "a": ["é", 1.5]}
    env = envelope(arguments=args)
    assert env.arguments_json == canonical_json(args) == '{"a":["é",1.5],"b":50}'
    assert idempotency_key("acme", "run-1", "t", env.arguments()) == idempotency_key("acme", "run-1", "t", args)


def test_the_encoding_is_deterministic_and_names_its_format_and_version():
    env = envelope()
    assert encode(env) == encode(dataclasses.replace(env))
    doc = json.loads(encode(env))
    assert doc["format"] == "ringfence/work-envelope" and doc["version"] == FORMAT_VERSION
    # Every field of the dataclass is in what is signed, by name.
    assert {f.name for f in dataclasses.fields(Envelope)} <= set(doc)
    assert decode(encode(env)) == env


def test_two_deliveries_of_one_call_share_its_logical_key_and_digest_but_not_their_id():
    a, b = envelope(), envelope(deadline=NOW + 120, traceparent="")
    assert a.envelope_id != b.envelope_id
    assert a.logical_key == b.logical_key and a.call_digest == b.call_digest
    other = envelope(arguments={"amount": 51})
    assert other.logical_key == a.logical_key and other.call_digest != a.call_digest
    assert envelope(tenant="other").logical_key != a.logical_key
    # Placed on another worker (after a worker was lost): another delivery of the same call.
    moved = envelope(worker_id="worker-2")
    assert moved.logical_key == a.logical_key and moved.call_digest == a.call_digest


@pytest.mark.parametrize("change", [
    {"image_digest": "sha256:" + "A" * 64}, {"image_digest": "tool"}, {"deadline": NOW}, {"deadline": float("nan")},
    {"tenant": ""}, {"run_id": "run\n1"}, {"worker_id": ""}, {"worker_id": "w\x00"}, {"worker_id": None},
    {"traceparent": "not-a-traceparent"}, {"idempotency_key": ""},
    {"egress": GrantedEgress(allow=("a.example",)), "profile": SandboxSpec(runtime="gvisor")},
    {"arguments": {"x": float("nan")}}, {"arguments": {"x": object()}},
])
def test_an_envelope_the_sandbox_could_not_honour_is_never_built(change):
    with pytest.raises(ValueError):
        envelope(**change)


@pytest.mark.parametrize("profile", [
    {"runtime": "kata"}, {"cpus": 4.0}, {"memory_bytes": 1}, {"pids": True}, {"workspace": "rw"},
    {"input_roots": ("/b", "/a")}, {"input_roots": ("rel",)}, {"warm": 1},
])
def test_a_profile_outside_the_sandboxs_ranges_is_never_built(profile):
    with pytest.raises(ValueError):
        SandboxSpec(**profile)


def test_a_grant_is_held_in_its_canonical_form():
    with pytest.raises(ValueError):
        GrantedEgress(allow=("B.example.com",))  # the proxy's form is lower case, sorted
    with pytest.raises(ValueError):
        GrantedEgress(allow=())
    assert GrantedEgress(allow=("a.example", "b.example")).to_grant().allow == ("a.example", "b.example")


def test_arguments_not_in_canonical_form_are_refused():
    env = envelope()
    with pytest.raises(ValueError):
        dataclasses.replace(env, arguments_json='{"b":1, "a":2}')
    with pytest.raises(ValueError):
        dataclasses.replace(env, arguments_json="[1,2]")


# -- every refusal -----------------------------------------------------------------------------


def test_unsigned():
    assert refused(dataclasses.replace(seal(envelope(), CONTROL_KEY), signature=b"")) is Refusal.UNSIGNED


def test_unknown_key():
    sealed = seal(envelope(), CONTROL_KEY)
    assert refused(sealed, TrustedKeys()) is Refusal.UNKNOWN_KEY
    stranger = generate_private_key()
    assert refused(seal(envelope(), stranger)) is Refusal.UNKNOWN_KEY


def test_a_stranger_signing_under_a_trusted_key_id():
    stranger = generate_private_key()
    assert refused(signed(encode(envelope()), key=stranger)) is Refusal.BAD_SIGNATURE


@pytest.mark.parametrize("signature", [b"\0" * 64, os.urandom(64), b"x", os.urandom(65)])
def test_a_signature_that_is_not_one(signature):
    sealed = dataclasses.replace(seal(envelope(), CONTROL_KEY), signature=signature)
    assert refused(sealed) is Refusal.BAD_SIGNATURE


def _tampered(value):
    """Another JSON value of the same kind (a nested object: its every member tampered in turn)."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, (int, float)):
        return value + 1
    if isinstance(value, str):
        return value + "0"
    if isinstance(value, list):
        return [*value, "/x"]
    return "x"  # None


NESTED = {"profile": SandboxSpec, "egress": GrantedEgress}


def _every_field_tampered(payload: bytes):
    """(name, payload) for each field of the envelope (and of its nested values) changed alone,
    re-encoded canonically: the field list comes from the dataclasses, so a field added later is
    tampered with too."""
    doc = json.loads(payload)
    names = [f.name for f in dataclasses.fields(Envelope)]
    assert set(doc) == {*names, "format", "version"}, "a field is not in the payload"
    for name in [*names, "format", "version"]:
        if name in NESTED:
            for inner in dataclasses.fields(NESTED[name]):
                changed = json.loads(payload)
                changed[name][inner.name] = _tampered(changed[name][inner.name])
                yield f"{name}.{inner.name}", _canonical(changed)
            whole = json.loads(payload)
            whole[name] = None
            yield f"{name}=None", _canonical(whole)
        else:
            changed = json.loads(payload)
            changed[name] = _tampered(changed[name])
            yield name, _canonical(changed)


def _canonical(doc) -> bytes:
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def test_tampering_with_any_field_breaks_the_signature():
    sealed = seal(envelope(), CONTROL_KEY)
    seen = []
    for name, payload in _every_field_tampered(sealed.payload):
        assert payload != sealed.payload, name
        assert refused(dataclasses.replace(sealed, payload=payload)) is Refusal.BAD_SIGNATURE, name
        seen.append(name)
    assert "worker_id" in seen  # format version 2's field: signed, so covered by the loop
    assert "attempt" in seen  # and version 3's
    assert len(seen) == len(dataclasses.fields(Envelope)) + 2 + len(dataclasses.fields(SandboxSpec)) \
        + len(dataclasses.fields(GrantedEgress))


def test_tampering_with_the_seal_itself():
    sealed = seal(envelope(), CONTROL_KEY)
    other = generate_private_key()
    both = TrustedKeys.of([CONTROL_KEY.public_key(), other.public_key()])
    # Another trusted key's name on this key's signature: the key id is signed too.
    assert refused(dataclasses.replace(sealed, key_id=key_id(other.public_key())), both) is Refusal.BAD_SIGNATURE
    assert refused(dataclasses.replace(sealed, signature=bytes([sealed.signature[0] ^ 1]) + sealed.signature[1:])) \
        is Refusal.BAD_SIGNATURE


def test_a_signature_moved_to_another_envelope():
    a = seal(envelope(arguments={"amount": 1}), CONTROL_KEY)
    b = seal(envelope(arguments={"amount": 1_000_000}), CONTROL_KEY)
    assert refused(dataclasses.replace(b, signature=a.signature)) is Refusal.BAD_SIGNATURE
    # Even between deliveries of one logical call (same content, another envelope id).
    c = seal(envelope(arguments={"amount": 1}), CONTROL_KEY)
    assert refused(dataclasses.replace(c, signature=a.signature)) is Refusal.BAD_SIGNATURE


def test_a_signature_over_the_payload_without_the_domain_and_version_is_refused():
    # The same key signing the bare payload (another protocol, a careless tool): not an envelope.
    sealed = seal(envelope(), CONTROL_KEY)
    bare = CONTROL_KEY.sign(sealed.payload)
    assert refused(dataclasses.replace(sealed, signature=bare)) is Refusal.BAD_SIGNATURE
    no_domain = CONTROL_KEY.sign(signed_message(FORMAT_VERSION, OWN_ID, sealed.payload)[len(DOMAIN):])
    assert refused(dataclasses.replace(sealed, signature=no_domain)) is Refusal.BAD_SIGNATURE


def test_expired():
    env = envelope(deadline=NOW + 5)
    sealed = seal(env, CONTROL_KEY)
    assert open_sealed(sealed, TRUSTED, NOW + 4.999).envelope_id == env.envelope_id
    assert refused(sealed, now=NOW + 5) is Refusal.EXPIRED
    assert refused(sealed, now=NOW + 3600) is Refusal.EXPIRED


def test_wrong_version():
    sealed = seal(envelope(), CONTROL_KEY)
    assert refused(dataclasses.replace(sealed, version=FORMAT_VERSION + 1)) is Refusal.WRONG_VERSION
    # Properly signed as version 2: still a version this worker does not read.
    assert refused(signed(sealed.payload, version=FORMAT_VERSION + 1)) is Refusal.WRONG_VERSION
    wire = bytearray(sealed.to_bytes())
    wire[7] += 1
    with pytest.raises(EnvelopeRefused) as e:
        SealedEnvelope.from_bytes(bytes(wire))
    assert e.value.reason is Refusal.WRONG_VERSION


# The fields each earlier format version lacked: version 1 named no worker, version 2 no attempt.
_ADDED_SINCE = {1: ("worker_id", "attempt"), 2: ("attempt",)}


def _old_version(env: Envelope, version: int) -> bytes:
    """`env` as format version `version` encoded it: the same fields less those added since."""
    doc = json.loads(encode(dataclasses.replace(env, key_id=OWN_ID)))
    for name in _ADDED_SINCE[version]:
        del doc[name]
    doc["version"] = version
    return _canonical(doc)


@pytest.mark.parametrize("version", [1, 2])
def test_an_envelope_of_an_earlier_version_is_refused_as_wrong_version(version):
    # Properly signed by a trusted key, in its own version's framing, it is still refused before
    # anything of it is read (no worker of versions 1 or 2 was ever deployed: there is nothing to
    # stay compatible with).
    assert FORMAT_VERSION == 3
    old = signed(_old_version(envelope(), version), version=version)
    assert refused(old) is Refusal.WRONG_VERSION
    assert refused(dataclasses.replace(seal(envelope(), CONTROL_KEY), version=version)) is Refusal.WRONG_VERSION
    with pytest.raises(EnvelopeRefused) as e:
        SealedEnvelope.from_bytes(old.to_bytes())
    assert e.value.reason is Refusal.WRONG_VERSION
    # Its payload under this version's seal: not an envelope of this version (a field missing).
    assert refused(signed(_old_version(envelope(), version))) is Refusal.MALFORMED


def test_the_attempt_is_signed_and_part_of_the_logical_key():
    # Attempt 2 of a call is another logical key (the retry runs); a redelivery of attempt 1 is
    # the same key (it does not).
    first, retry = envelope(), envelope(attempt=2)
    assert first.logical_key != retry.logical_key and first.logical_key.attempt == 1
    assert envelope(deadline=NOW + 120).logical_key == first.logical_key
    sealed = seal(first, CONTROL_KEY)
    doc = json.loads(sealed.payload)
    assert doc["attempt"] == 1
    doc["attempt"] = 2  # an attacker turning a redelivery into a retry, to run it again
    assert refused(dataclasses.replace(sealed, payload=_canonical(doc))) is Refusal.BAD_SIGNATURE
    assert open_sealed(seal(retry, CONTROL_KEY), TRUSTED, NOW).attempt == 2


@pytest.mark.parametrize("attempt", [0, -1, True, 1.0, "1", None, envelope_mod.MAX_ATTEMPT + 1])
def test_an_attempt_that_is_not_a_positive_integer_is_never_built(attempt):
    with pytest.raises(ValueError):
        envelope(attempt=attempt)


def test_the_worker_id_is_signed_and_not_part_of_the_call():
    sealed = seal(envelope(), CONTROL_KEY)
    doc = json.loads(sealed.payload)
    assert doc["worker_id"] == "worker-1"
    doc["worker_id"] = "worker-2"  # an attacker moving a captured envelope to another worker
    assert refused(dataclasses.replace(sealed, payload=_canonical(doc))) is Refusal.BAD_SIGNATURE
    assert open_sealed(sealed, TRUSTED, NOW).worker_id == "worker-1"


# The last: this version's framing (FORMAT_VERSION, 4 bytes), then a part longer than what follows.
@pytest.mark.parametrize("wire", [b"", b"RFWE", b"garbage that is not an envelope",
                                  b"RFWE" + FORMAT_VERSION.to_bytes(4, "big") + b"\xff\xff"])
def test_malformed_framing(wire):
    with pytest.raises(EnvelopeRefused) as e:
        SealedEnvelope.from_bytes(wire)
    assert e.value.reason is Refusal.MALFORMED


def test_truncated_or_extended_framing():
    wire = seal(envelope(), CONTROL_KEY).to_bytes()
    for bad in (wire[:-1], wire + b"\0", wire[:20]):
        with pytest.raises(EnvelopeRefused) as e:
            SealedEnvelope.from_bytes(bad)
        assert e.value.reason is Refusal.MALFORMED


def _payload_variants():
    """Payloads a trusted control plane might sign by mistake, none of them a canonical envelope."""
    good = encode(dataclasses.replace(envelope(), key_id=OWN_ID))
    doc = json.loads(good)
    yield "not json", b"\xff not json"
    yield "whitespace", json.dumps(doc, sort_keys=True).encode()
    yield "key order", json.dumps(dict(reversed(doc.items())), separators=(",", ":"), ensure_ascii=False).encode()
    yield "duplicate key", good[:-1] + b',"tenant":"other"}'
    yield "extra key", _canonical({**doc, "admin": True})
    yield "missing key", _canonical({k: v for k, v in doc.items() if k != "deadline"})
    yield "1 for 1.0", _canonical({**doc, "profile": {**doc["profile"], "timeout_s": 5}})
    yield "bool for int", _canonical({**doc, "profile": {**doc["profile"], "pids": True}})
    yield "str for number", _canonical({**doc, "deadline": str(doc["deadline"])})
    yield "a list", b"[]"
    yield "NaN", good.replace(b'"issued_at":' + str(doc["issued_at"]).encode(), b'"issued_at":NaN')
    yield "other format", _canonical({**doc, "format": "something/else"})
    yield "inner version", _canonical({**doc, "version": FORMAT_VERSION + 1})
    yield "inner version 1", _canonical({**doc, "version": 1})
    yield "no worker id", _canonical({k: v for k, v in doc.items() if k != "worker_id"})
    yield "no attempt", _canonical({k: v for k, v in doc.items() if k != "attempt"})
    yield "attempt 0", _canonical({**doc, "attempt": 0})
    yield "attempt 1.0", _canonical({**doc, "attempt": 1.0})
    yield "attempt true", _canonical({**doc, "attempt": True})
    yield "inner key id", _canonical({**doc, "key_id": key_id(generate_private_key().public_key())})
    yield "out of range", _canonical({**doc, "profile": {**doc["profile"], "cpus": 64.0}})
    yield "deep", b"[" * 100_000 + b"]" * 100_000


@pytest.mark.parametrize(("name", "payload"), list(_payload_variants()), ids=lambda v: v if isinstance(v, str) else "")
def test_a_signed_payload_that_is_not_a_canonical_envelope_is_malformed(name, payload):
    assert refused(signed(payload)) is Refusal.MALFORMED, name


def test_sealing_under_another_keys_id_is_refused():
    with pytest.raises(ValueError):
        seal(envelope(), CONTROL_KEY, key_id(generate_private_key().public_key()))


def test_the_refusal_order_is_the_documented_one():
    # An envelope wrong in every way is refused for its first fault, in open_sealed's order.
    sealed = seal(envelope(deadline=NOW + 1), CONTROL_KEY)
    late = NOW + 10
    faults = [
        ("wrong_version", lambda s: dataclasses.replace(s, version=9)),
        ("unsigned", lambda s: dataclasses.replace(s, signature=b"")),
        ("unknown_key", lambda s: dataclasses.replace(s, key_id="0" * 16)),
        ("bad_signature", lambda s: dataclasses.replace(s, payload=s.payload + b" ")),
    ]
    for i, (expected, _) in enumerate(faults):
        s = sealed
        for _, apply in faults[i:]:
            s = apply(s)
        assert refused(s, now=late).value == expected
    assert refused(signed(b"{}"), now=late) is Refusal.MALFORMED
    assert refused(sealed, now=late) is Refusal.EXPIRED
    doc = envelope_mod.__doc__ or ""
    assert [r.value for r in Refusal] == [line.split()[1] for line in doc.splitlines() if line[:2] in
                                          {f"{n}." for n in range(1, 7)}]


# -- properties --------------------------------------------------------------------------------

_json = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**62), 2**62) | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8,
)
_ids = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x2FF, exclude_characters="\x7f"), min_size=1,
               max_size=20)


@st.composite
def _envelopes(draw):
    issued = draw(st.floats(0, 4e9))
    return envelope(
        run_id=draw(_ids), call_id=draw(_ids), attempt=draw(st.integers(1, 20)), tenant=draw(_ids), tool=draw(_ids),
        arguments=draw(st.dictionaries(st.text(max_size=6), _json, max_size=4)),
        image_digest="sha256:" + draw(st.text("0123456789abcdef", min_size=64, max_size=64)),
        now=issued, deadline=issued + draw(st.floats(0.001, 1e6)),
        idempotency_key=draw(st.none() | _ids),
        profile=SandboxSpec(runtime=draw(st.sampled_from(["runc", "gvisor"])),
                            cpus=draw(st.floats(0.01, 2.0)), pids=draw(st.integers(8, 4096)),
                            timeout_s=draw(st.floats(0.1, 3600)), warm=draw(st.booleans())),
        egress=None,
    )


@settings(max_examples=150, deadline=None)
@given(env=_envelopes())
def test_any_envelope_round_trips_and_encodes_one_way(env):
    sealed = seal(env, CONTROL_KEY)
    assert decode(encode(env)) == env
    opened = open_sealed(SealedEnvelope.from_bytes(sealed.to_bytes()), TRUSTED, env.issued_at)
    assert opened == dataclasses.replace(env, key_id=OWN_ID)
    assert encode(opened) == sealed.payload


_SEALED_WIRE = seal(envelope(), CONTROL_KEY).to_bytes()


@settings(max_examples=300, deadline=None)
@given(at=st.integers(0, len(_SEALED_WIRE) - 1), mask=st.integers(1, 255))
def test_any_flipped_bit_of_the_wire_form_is_refused(at, mask):
    wire = bytearray(_SEALED_WIRE)
    wire[at] ^= mask
    with pytest.raises(EnvelopeRefused):
        open_sealed(SealedEnvelope.from_bytes(bytes(wire)), TRUSTED, NOW)


# -- red checks: the signature check switched off ------------------------------------------------


def _forged_delivery() -> SealedEnvelope:
    """An attacker's envelope: a real one with its image swapped and its arguments raised."""
    sealed = seal(envelope(arguments={"amount": 1}), CONTROL_KEY)
    doc = json.loads(sealed.payload)
    doc["image_digest"], doc["arguments_json"] = OTHER_DIGEST, canonical_json({"amount": 1_000_000})
    return dataclasses.replace(sealed, payload=_canonical(doc))


def test_red_check_without_signature_verification_a_forged_envelope_opens(monkeypatch):
    forged = _forged_delivery()
    assert refused(forged) is Refusal.BAD_SIGNATURE
    monkeypatch.setattr(envelope_mod, "_verify", lambda *_: None)  # the protection, removed
    opened = open_sealed(forged, TRUSTED, NOW)  # the attack now succeeds
    assert opened.image_digest == OTHER_DIGEST and opened.arguments() == {"amount": 1_000_000}


def test_red_check_the_tamper_loop_turns_red_without_verification(monkeypatch):
    # The loop above would not pass with the check gone: a field's tampering goes through.
    monkeypatch.setattr(envelope_mod, "_verify", lambda *_: None)
    sealed = seal(envelope(), CONTROL_KEY)
    passed = []
    for name, payload in _every_field_tampered(sealed.payload):
        try:
            open_sealed(dataclasses.replace(sealed, payload=payload), TRUSTED, NOW)
            passed.append(name)
        except EnvelopeRefused:
            pass
    assert "tenant" in passed and "run_id" in passed and "profile.pids" in passed and "worker_id" in passed
    assert "attempt" in passed


# -- keys --------------------------------------------------------------------------------------


def test_a_key_pair_round_trips_through_pem_files(tmp_path):
    key = generate_private_key()
    save_private_key(key, tmp_path / "cp.key")
    save_public_key(key.public_key(), tmp_path / "cp.pem")
    assert stat.S_IMODE((tmp_path / "cp.key").stat().st_mode) == 0o600
    loaded = load_private_key(tmp_path / "cp.key")
    assert key_id(loaded.public_key()) == key_id(key.public_key()) == key_id(load_public_key(tmp_path / "cp.pem"))
    # What one signs, the other's public key verifies.
    sealed = seal(envelope(), loaded)
    assert open_sealed(sealed, TrustedKeys.from_folder(tmp_path), NOW).key_id == key_id(key.public_key())


def test_the_key_id_is_derived_from_the_raw_public_key():
    import hashlib

    from cryptography.hazmat.primitives import serialization

    key = generate_private_key().public_key()
    raw = key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    assert key_id(key) == hashlib.sha256(raw).hexdigest()[:16]
    assert key_id(generate_private_key().public_key()) != key_id(key)


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o644, 0o620, 0o606])
def test_a_private_key_others_may_read_or_write_is_refused(tmp_path, mode):
    path = tmp_path / "cp.key"
    save_private_key(generate_private_key(), path)
    os.chmod(path, mode)
    with pytest.raises(KeyFileError, match="group or others"):
        load_private_key(path)


def test_a_private_key_file_is_never_overwritten_nor_read_through_a_symlink(tmp_path):
    path = tmp_path / "cp.key"
    save_private_key(generate_private_key(), path)
    with pytest.raises(FileExistsError):
        save_private_key(generate_private_key(), path)
    (tmp_path / "link.key").symlink_to(path)
    with pytest.raises(KeyFileError):
        load_private_key(tmp_path / "link.key")


def test_a_trust_folder_holds_public_ed25519_keys_only(tmp_path):
    save_public_key(generate_private_key().public_key(), tmp_path / "a.pem")
    save_public_key(generate_private_key().public_key(), tmp_path / "b.pem")
    (tmp_path / "README").write_text("not a key, not a .pem: ignored")
    assert len(TrustedKeys.from_folder(tmp_path)) == 2
    # A private key among them: a signing key on a worker host, refused.
    save_private_key(generate_private_key(), tmp_path / "c.pem")
    with pytest.raises(KeyFileError, match="private key"):
        TrustedKeys.from_folder(tmp_path)
    os.remove(tmp_path / "c.pem")
    # A key of another algorithm.
    from cryptography.hazmat.primitives import serialization

    ec_pem = ec.generate_private_key(ec.SECP256R1()).public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    with pytest.raises(KeyFileError, match="not an Ed25519 key"):
        TrustedKeys.from_pems([ec_pem])
    with pytest.raises(KeyFileError):
        TrustedKeys.from_pems([b"-----BEGIN PUBLIC KEY-----\nnope\n-----END PUBLIC KEY-----\n"])


def test_a_trust_set_cannot_name_a_key_by_another_keys_id():
    a, b = generate_private_key().public_key(), generate_private_key().public_key()
    with pytest.raises(KeyFileError):
        TrustedKeys({key_id(a): b})
    trusted = TrustedKeys.of([a, b])
    assert set(trusted) == {key_id(a), key_id(b)} and key_id(a) in trusted
