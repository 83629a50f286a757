"""The control plane's envelope signing keys: Ed25519 key pairs as PEM files, key ids, trust sets.

A control plane signs every work envelope with its private key; a worker holds only public keys
(`TrustedKeys`) and so can verify envelopes but never issue one. Who holds what:

    control plane   its private key (a PEM file, mode 0600, refused when group or others can read it)
    worker          the public keys of the control planes it takes work from (a folder of PEMs)

A key id names a public key in a sealed envelope (so a worker trusting several control planes, or
a key rotation's old and new key, knows which key to verify with). It is derived from the key
itself, never chosen: two keys cannot share an id by configuration mistake, and an id cannot be
pointed at another key.
"""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from ringfence_server.worker.errors import WorkerError

__all__ = [
    "KEY_ID_HEX",
    "KeyFileError",
    "TrustedKeys",
    "generate_private_key",
    "key_id",
    "load_private_key",
    "load_public_key",
    "public_key_from_pem",
    "save_private_key",
    "save_public_key",
]

KEY_ID_HEX = 16
"""Hex digits of a key id: the first 64 bits of sha256 of the raw public key. Enough to tell a
deployment's handful of keys apart; it is a name, not a security boundary (the signature is)."""

# Group and others: any of their permission bits on a private key file is refused.
_NOT_OWNER = stat.S_IRWXG | stat.S_IRWXO
# Read at most this much of a key file: a PEM Ed25519 key is about 120 bytes.
_MAX_PEM_BYTES = 16 * 1024


class KeyFileError(WorkerError):
    """A key file that cannot be used: missing, not a regular file, readable by others, not an
    Ed25519 key in PEM. The message names the file and why."""


def generate_private_key() -> Ed25519PrivateKey:
    return Ed25519PrivateKey.generate()


def key_id(public_key: Ed25519PublicKey) -> str:
    """The id of `public_key`: the first KEY_ID_HEX hex digits of sha256 of its 32 raw bytes."""
    raw = public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()[:KEY_ID_HEX]


def save_private_key(private_key: Ed25519PrivateKey, path: Path) -> None:
    """Write `private_key` as unencrypted PKCS#8 PEM to a new file of mode 0600.

    Never overwrites: replacing a signing key is a rotation (a new key, trusted by the workers
    before it signs), not a side effect of a command run twice. The file is created 0600 (not
    chmod-ed after), so there is no moment when others may read it."""
    pem = private_key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                    serialization.NoEncryption())
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        os.fchmod(fd, 0o600)  # the umask may only remove bits; this pins the mode exactly
        os.write(fd, pem)
        os.fsync(fd)
    finally:
        os.close(fd)


def save_public_key(public_key: Ed25519PublicKey, path: Path) -> None:
    """Write `public_key` as SubjectPublicKeyInfo PEM (mode 0644: a public key is meant to be read)."""
    pem = public_key.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
    try:
        os.write(fd, pem)
    finally:
        os.close(fd)


def _read_key_file(path: Path, *, private: bool) -> bytes:
    # One descriptor for the check and the read (fstat, not stat then open): the file checked is
    # the file read. O_NOFOLLOW: a symlink is not followed to somewhere the check did not look.
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError as e:
        raise KeyFileError(f"{path}: cannot be opened ({e.strerror})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise KeyFileError(f"{path}: not a regular file")
        if private and st.st_mode & _NOT_OWNER:
            raise KeyFileError(f"{path}: a private key readable or writable by group or others "
                               f"(mode {stat.S_IMODE(st.st_mode):04o}); chmod 600 it")
        data = os.read(fd, _MAX_PEM_BYTES + 1)
    finally:
        os.close(fd)
    if len(data) > _MAX_PEM_BYTES:
        raise KeyFileError(f"{path}: over {_MAX_PEM_BYTES} bytes, not a key file")
    return data


def load_private_key(path: Path) -> Ed25519PrivateKey:
    """The Ed25519 private key in the PEM file at `path`, refused unless only its owner may read it."""
    data = _read_key_file(path, private=True)
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError) as e:
        raise KeyFileError(f"{path}: not an unencrypted PEM private key ({e})") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise KeyFileError(f"{path}: a {type(key).__name__}, not an Ed25519 key")
    return key


def public_key_from_pem(data: bytes, source: str = "<pem>") -> Ed25519PublicKey:
    """The Ed25519 public key of one PEM text. A private key is refused: trust material is public,
    and a private key in a worker's trust folder is a signing key on a host that runs tool code."""
    if b"PRIVATE KEY" in data:
        raise KeyFileError(f"{source}: a private key; a worker is given public keys only")
    try:
        key = serialization.load_pem_public_key(data)
    except (ValueError, TypeError) as e:
        raise KeyFileError(f"{source}: not a PEM public key ({e})") from None
    if not isinstance(key, Ed25519PublicKey):
        raise KeyFileError(f"{source}: a {type(key).__name__}, not an Ed25519 key")
    return key


def load_public_key(path: Path) -> Ed25519PublicKey:
    return public_key_from_pem(_read_key_file(path, private=False), str(path))


@dataclass(frozen=True)
class TrustedKeys:
    """The public keys a worker accepts envelopes from, by key id. Immutable: a new trust set is a
    new value (loaded again), so a check in progress never sees the set change under it."""

    by_id: Mapping[str, Ed25519PublicKey] = field(default_factory=dict)
    """key id (`key_id`) -> the public key it names; frozen read-only on construction."""

    def __post_init__(self) -> None:
        for kid, key in self.by_id.items():
            if key_id(key) != kid:
                # An id is derived, never assigned: a mismatch would let one key verify under
                # another's name.
                raise KeyFileError(f"key id {kid!r} is not the id of its key ({key_id(key)})")
        object.__setattr__(self, "by_id", MappingProxyType(dict(self.by_id)))

    @classmethod
    def of(cls, keys: Iterable[Ed25519PublicKey]) -> TrustedKeys:
        return cls({key_id(k): k for k in keys})

    @classmethod
    def from_pems(cls, pems: Iterable[bytes]) -> TrustedKeys:
        return cls.of(public_key_from_pem(p, f"<pem {i}>") for i, p in enumerate(pems))

    @classmethod
    def from_folder(cls, folder: Path) -> TrustedKeys:
        """Every *.pem file in `folder` (not recursive; other files are ignored), each a public key.
        One that cannot be read or is not a public Ed25519 key fails the whole load: a broken trust
        set is an error, never quietly a smaller one."""
        if not folder.is_dir():
            raise KeyFileError(f"{folder}: not a folder of public keys")
        paths = sorted(p for p in folder.iterdir() if p.suffix == ".pem")
        return cls.of(load_public_key(p) for p in paths)

    def get(self, kid: str) -> Ed25519PublicKey | None:
        return self.by_id.get(kid)

    def __contains__(self, kid: object) -> bool:
        return kid in self.by_id

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self.by_id))

    def __len__(self) -> int:
        return len(self.by_id)
