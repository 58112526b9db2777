"""Signed notes, checkpoints and cosignatures (C2SP; docs/FORMAT.md sections 15 and 16).

* ``signed-note`` v1.0.0: a text ending in a newline, a blank line, and signature lines
  ``— <key name> base64(key ID || signature)``; Ed25519 keys (signature type 0x01) with
  key ID = SHA-256(name || 0x0A || type || public key)[:4], verifier keys
  ``<name>+<hex key ID>+base64(type || public key)``, and the private-key text Go's
  ``golang.org/x/mod/sumdb/note`` reads (``PRIVATE+KEY+<name>+<hex ID>+base64(type || seed)``).
* ``tlog-checkpoint`` v1.0.0: origin, tree size, base64 root hash, optional extension lines.
* ``tlog-cosignature`` v1: Ed25519 cosignatures (type 0x04) over
  ``cosignature/v1\\ntime <T>\\n`` + the checkpoint text, carrying an 8-byte timestamp.
* the ``tlog-witness`` ``add-checkpoint`` request body.

Pure: no I/O, no clock (timestamps are passed in). Standard library and ``cryptography``
only, so the standalone verifier can use it as it is.
"""

from __future__ import annotations

import base64
import binascii
import functools
import hashlib
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

ALG_ED25519 = 0x01
ALG_COSIGNATURE_V1 = 0x04
MAX_SIGNATURES = 100  # signed-note asks verifiers to accept at least 16
MAX_PROOF_LINES = 63  # tlog-witness
HASH_SIZE = 32
SIGNATURE_PREFIX = "\u2014 "  # em dash, space
COSIGNATURE_HEADER = "cosignature/v1\n"
_DECIMAL = re.compile(r"0|[1-9][0-9]*")
_HEX_ID = re.compile(r"[0-9a-f]{8}")
#: checkpoint signature checks remembered (:func:`checked_checkpoint`)
CHECKED_KEPT = 256


class NoteError(ValueError):
    """A note, key, checkpoint or request is malformed or does not verify; the message says why."""


def _b64decode(text: str, what: str) -> bytes:
    """Standard base64 with padding, nothing else (RFC 4648 section 4)."""
    try:
        return base64.b64decode(text.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError, ValueError):
        raise NoteError(f"{what} is not standard base64") from None


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def check_key_name(name: str) -> str:
    """A key name is non-empty, with no Unicode space and no plus sign (signed-note)."""
    if (
        not isinstance(name, str)
        or not name
        or "+" in name
        or any(ch.isspace() for ch in name)
        or any(ord(ch) < 0x20 for ch in name)
    ):
        raise NoteError(f"{name!r} is not a valid key name (non-empty, no spaces, no '+')")
    return name


def key_id(name: str, alg: int, public_key: bytes) -> int:
    """SHA-256(name || 0x0A || type || public key)[:4] as a big-endian integer."""
    digest = hashlib.sha256(name.encode("utf-8") + b"\n" + bytes([alg]) + public_key).digest()
    return int.from_bytes(digest[:4], "big")


@dataclass(frozen=True)
class Signature:
    """One signature line: the key name, the key ID, and the bytes after the key ID."""

    name: str
    key_id: int
    data: bytes

    @property
    def line(self) -> str:
        return f"{SIGNATURE_PREFIX}{self.name} {_b64(self.key_id.to_bytes(4, 'big') + self.data)}\n"

    @property
    def timestamp(self) -> int:
        """The cosignature/v1 timestamp (POSIX seconds) of a type-0x04 signature."""
        if len(self.data) != 8 + 64:
            raise NoteError(f"the signature of {self.name} is not a cosignature/v1")
        return int.from_bytes(self.data[:8], "big")


@dataclass(frozen=True)
class Note:
    text: str
    signatures: tuple[Signature, ...]

    def encode(self) -> bytes:
        return format_note(self.text, self.signatures)


def _check_text(text: str) -> None:
    if not text.endswith("\n"):
        raise NoteError("a note's text must end with a newline")
    if any(ord(ch) < 0x20 and ch != "\n" for ch in text):
        raise NoteError("a note must not contain control characters other than newline")


def format_note(text: str, signatures: Iterable[Signature]) -> bytes:
    """The note's bytes: text, blank line, one line per signature."""
    _check_text(text)
    signatures = list(signatures)
    if not signatures:
        raise NoteError("a signed note has at least one signature")
    for s in signatures:
        check_key_name(s.name)
    return (text + "\n" + "".join(s.line for s in signatures)).encode("utf-8")


def parse_note(data: bytes | str) -> Note:
    """Split a signed note into its text and signature lines, by the signed-note rules.

    Nothing is verified here; :func:`open_note` verifies.
    """
    if isinstance(data, bytes):
        try:
            message = data.decode("utf-8")
        except UnicodeDecodeError:
            raise NoteError("a note must be valid UTF-8") from None
    else:
        message = data
    if any(0xD800 <= ord(ch) <= 0xDFFF for ch in message):
        raise NoteError("a note must be valid UTF-8")
    if any(ord(ch) < 0x20 and ch != "\n" for ch in message):
        raise NoteError("a note must not contain control characters other than newline")
    if not message.endswith("\n"):
        raise NoteError("a note must end with a newline")
    split = message.rfind("\n\n")
    if split < 0:
        raise NoteError("a note has no blank line before its signatures")
    text, rest = message[: split + 1], message[split + 2 :]
    signatures: list[Signature] = []
    for line in rest[:-1].split("\n") if rest else []:
        if not line.startswith(SIGNATURE_PREFIX):
            raise NoteError("a line after the blank line is not a signature line")
        name, space, encoded = line[len(SIGNATURE_PREFIX) :].partition(" ")
        if not space:
            raise NoteError("a signature line has no signature after the key name")
        check_key_name(name)
        raw = _b64decode(encoded, f"the signature of {name}")
        if len(raw) < 5:
            raise NoteError(f"the signature of {name} is too short")
        signatures.append(Signature(name, int.from_bytes(raw[:4], "big"), raw[4:]))
        if len(signatures) > MAX_SIGNATURES:
            raise NoteError(f"a note with more than {MAX_SIGNATURES} signatures is refused")
    if not signatures:
        raise NoteError("a note has no signature lines")
    return Note(text, tuple(signatures))


# -- keys ---------------------------------------------------------------------------------


class Verifier:
    """A verifier key: name, key ID, type and public key; checks one signature line."""

    def __init__(self, name: str, alg: int, public_key: bytes) -> None:
        if alg not in (ALG_ED25519, ALG_COSIGNATURE_V1):
            raise NoteError(f"signature type 0x{alg:02x} is not supported (0x01 and 0x04 are)")
        if len(public_key) != 32:
            raise NoteError("an Ed25519 public key is 32 bytes")
        self.name = check_key_name(name)
        self.alg = alg
        self.public_key = bytes(public_key)
        self.key_id = key_id(name, alg, self.public_key)
        self._key = Ed25519PublicKey.from_public_bytes(self.public_key)

    @classmethod
    def from_vkey(cls, vkey: str) -> Verifier:
        """Parse ``<name>+<8 hex>+<base64(type || key)>``; the key ID must match the key."""
        name, plus, rest = vkey.partition("+")
        hex_id, plus2, encoded = rest.partition("+")
        if not plus or not plus2 or not _HEX_ID.fullmatch(hex_id):
            raise NoteError("a verifier key is <name>+<8 lowercase hex>+<base64>")
        raw = _b64decode(encoded, "the verifier key")
        if not raw:
            raise NoteError("the verifier key has no key material")
        verifier = cls(name, raw[0], raw[1:])
        if verifier.key_id != int(hex_id, 16):
            raise NoteError(f"the key ID {hex_id} of {name} does not match its public key")
        return verifier

    @property
    def vkey(self) -> str:
        return f"{self.name}+{self.key_id:08x}+{_b64(bytes([self.alg]) + self.public_key)}"

    def verify(self, text: str, signature: Signature) -> bool:
        """Whether ``signature`` (already matched by name and key ID) signs ``text``."""
        if self.alg == ALG_ED25519:
            message, sig = text.encode("utf-8"), signature.data
        else:
            if len(signature.data) != 8 + 64:
                return False
            message = cosigned_message(text, int.from_bytes(signature.data[:8], "big"))
            sig = signature.data[8:]
        try:
            self._key.verify(sig, message)
        except InvalidSignature:
            return False
        return True


def cosigner_verifier(vkey: str) -> Verifier:
    """A witness's cosigner key from its verifier key in either form C2SP allows: type 0x04
    (tlog-cosignature), or the common Ed25519 type 0x01 that Go's note tools make (the same
    public key; its cosignatures are checked as type 0x04, whose key ID they carry)."""
    verifier = Verifier.from_vkey(vkey)
    if verifier.alg == ALG_COSIGNATURE_V1:
        return verifier
    return Verifier(verifier.name, ALG_COSIGNATURE_V1, verifier.public_key)


class Signer:
    """An Ed25519 signing key for notes (type 0x01) or cosignatures (type 0x04)."""

    def __init__(self, name: str, seed: bytes, alg: int = ALG_ED25519) -> None:
        if len(seed) != 32:
            raise NoteError("an Ed25519 seed is 32 bytes")
        self._private = Ed25519PrivateKey.from_private_bytes(bytes(seed))
        self._seed = bytes(seed)
        public = self._private.public_key().public_bytes_raw()
        self.verifier = Verifier(name, alg, public)
        self.name, self.alg, self.key_id = name, alg, self.verifier.key_id

    @classmethod
    def generate(cls, name: str, alg: int = ALG_ED25519) -> Signer:
        seed = Ed25519PrivateKey.generate().private_bytes_raw()
        return cls(name, seed, alg)

    @classmethod
    def from_private_key(cls, text: str) -> Signer:
        """Parse ``PRIVATE+KEY+<name>+<8 hex>+<base64(type || seed)>`` (Go's note format)."""
        fields = text.strip().split("+", 4)
        if len(fields) != 5 or fields[:2] != ["PRIVATE", "KEY"] or not _HEX_ID.fullmatch(fields[3]):
            raise NoteError("a private key is PRIVATE+KEY+<name>+<8 lowercase hex>+<base64>")
        raw = _b64decode(fields[4], "the private key")
        if len(raw) != 33:
            raise NoteError("the private key must hold a type byte and a 32-byte seed")
        signer = cls(fields[2], raw[1:], raw[0])
        if signer.key_id != int(fields[3], 16):
            raise NoteError(f"the key ID {fields[3]} of {fields[2]} does not match the key")
        return signer

    def as_cosigner(self) -> Signer:
        """This Ed25519 key as a cosigner (type 0x04): a witness key file may hold the type
        0x01 form, which Go's note signers read (they refuse 0x04)."""
        return Signer(self.name, self._seed, ALG_COSIGNATURE_V1)

    @property
    def private_key(self) -> str:
        """The private key text (goes in a 0600 file, never in output)."""
        encoded = _b64(bytes([self.alg]) + self._seed)
        return f"PRIVATE+KEY+{self.name}+{self.key_id:08x}+{encoded}"

    @property
    def vkey(self) -> str:
        return self.verifier.vkey

    def sign(self, text: str) -> Signature:
        """A note signature (type 0x01) over ``text``."""
        if self.alg != ALG_ED25519:
            raise NoteError("a cosigner key signs with cosign(), not sign()")
        _check_text(text)
        return Signature(self.name, self.key_id, self._private.sign(text.encode("utf-8")))

    def cosign(self, checkpoint_text: str, timestamp: int) -> Signature:
        """A cosignature/v1 (type 0x04) over a checkpoint's text at ``timestamp``."""
        if self.alg != ALG_COSIGNATURE_V1:
            raise NoteError("only a cosigner key (type 0x04) makes cosignatures")
        parse_checkpoint(checkpoint_text)
        signature = self._private.sign(cosigned_message(checkpoint_text, timestamp))
        return Signature(self.name, self.key_id, timestamp.to_bytes(8, "big") + signature)


def cosigned_message(checkpoint_text: str, timestamp: int) -> bytes:
    """The bytes a cosignature/v1 signs: header, time line, checkpoint text."""
    if type(timestamp) is not int or not 0 <= timestamp <= 2**63 - 1:
        raise NoteError("a cosignature timestamp is an integer from 0 to 2**63 - 1")
    return (COSIGNATURE_HEADER + f"time {timestamp}\n" + checkpoint_text).encode("utf-8")


def sign_note(text: str, signers: Sequence[Signer]) -> bytes:
    """A note over ``text`` signed by each signer, in order."""
    return format_note(text, [signer.sign(text) for signer in signers])


def open_note(data: bytes | str, verifiers: Sequence[Verifier]) -> tuple[Note, list[Signature]]:
    """Parse and verify a note; return it with its verified signatures (duplicates once).

    Signatures from unknown keys (name and key ID not both known) are ignored. A known key
    whose signature fails rejects the whole note, and so does a note with no verified
    signature (signed-note, "Signatures").
    """
    note = parse_note(data)
    known: dict[tuple[str, int], Verifier] = {}
    for verifier in verifiers:
        same = known.setdefault((verifier.name, verifier.key_id), verifier)
        if same.public_key != verifier.public_key:
            raise NoteError(f"two verifier keys share {verifier.name}+{verifier.key_id:08x}")
    verified: list[Signature] = []
    for signature in note.signatures:
        match = known.get((signature.name, signature.key_id))
        if match is None:
            continue
        if not match.verify(note.text, signature):
            raise NoteError(
                f"the signature of {signature.name}+{signature.key_id:08x} does not verify"
            )
        if signature not in verified:
            verified.append(signature)
    if not verified:
        raise NoteError("the note has no signature from a known key")
    return note, verified


# -- checkpoints ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Checkpoint:
    origin: str
    size: int
    root: bytes
    extensions: tuple[str, ...] = ()

    @property
    def text(self) -> str:
        return format_checkpoint(self)


def format_checkpoint(checkpoint: Checkpoint) -> str:
    """The note text of a checkpoint (ends with a newline)."""
    text = (
        "\n".join(
            [
                checkpoint.origin,
                str(checkpoint.size),
                _b64(checkpoint.root),
                *checkpoint.extensions,
            ]
        )
        + "\n"
    )
    parse_checkpoint(text)  # one set of rules for what we write and what we read
    return text


def parse_checkpoint(text: str) -> Checkpoint:
    """A checkpoint body by tlog-checkpoint v1.0.0: origin, size, 32-byte base64 root, extensions."""
    _check_text(text)
    lines = text[:-1].split("\n")
    if len(lines) < 3:
        raise NoteError("a checkpoint has an origin, a tree size and a root hash line")
    origin, size, root_line, *extensions = lines
    if not origin:
        raise NoteError("a checkpoint's origin line is empty")
    if not _DECIMAL.fullmatch(size):
        raise NoteError("a checkpoint's tree size is decimal with no leading zeros")
    root = _b64decode(root_line, "the checkpoint's root hash")
    if len(root) != HASH_SIZE:
        raise NoteError(f"a checkpoint's root hash is {HASH_SIZE} bytes")
    if any(not line for line in extensions):
        raise NoteError("a checkpoint's extension lines are non-empty")
    return Checkpoint(origin, int(size), root, tuple(extensions))


def open_checkpoint(
    data: bytes | str, log: Verifier, witnesses: Sequence[Verifier] = ()
) -> tuple[Checkpoint, Note, list[Signature]]:
    """Verify a checkpoint signed by ``log``; return it, the note and the verified cosignatures.

    The log's own signature is required (the origin must be its key name); cosignatures from
    the given witness keys are verified, others ignored.
    """
    note, verified = open_note(data, [log, *witnesses])
    checkpoint = parse_checkpoint(note.text)
    if checkpoint.origin != log.name:
        raise NoteError(
            f"the checkpoint's origin {checkpoint.origin!r} is not the log {log.name!r}"
        )
    if not any(s.name == log.name and s.key_id == log.key_id for s in verified):
        raise NoteError(f"the checkpoint is not signed by the log key {log.name}")
    cosigned = [s for s in verified if (s.name, s.key_id) != (log.name, log.key_id)]
    return checkpoint, note, cosigned


@functools.lru_cache(maxsize=CHECKED_KEPT)
def checked_checkpoint(log_vkey: str, note: bytes | str) -> tuple[Verifier, Checkpoint]:
    """:func:`open_checkpoint` with the log key ``log_vkey``, remembered: the one cache of
    checkpoint signature checks. Pure (the check of the note's own bytes), so a hit is the
    same answer; every recall and every witness read re-checks the same newest checkpoint,
    which was a tenth of a query's time. A failure is not remembered (it raises again)."""
    log_key = Verifier.from_vkey(log_vkey)
    return log_key, open_checkpoint(note, log_key)[0]


def log_signed_note(checkpoint: Checkpoint, log_vkey: str, signature: bytes) -> bytes:
    """The note of ``checkpoint`` with only the log's signature (as ``signed_checkpoints``
    stores it: the bytes after the key ID), for :func:`checked_checkpoint`."""
    name, _, rest = log_vkey.partition("+")
    hex_id = rest.partition("+")[0]
    if not _HEX_ID.fullmatch(hex_id):
        raise NoteError("a verifier key is <name>+<8 lowercase hex>+<base64>")
    return format_note(format_checkpoint(checkpoint), [Signature(name, int(hex_id, 16), signature)])


# -- tlog-witness add-checkpoint ------------------------------------------------------------


def format_add_checkpoint(old_size: int, proof: Sequence[bytes], note: bytes) -> bytes:
    """The body of a tlog-witness ``add-checkpoint`` request."""
    if type(old_size) is not int or old_size < 0:
        raise NoteError("the old size is a non-negative integer")
    if len(proof) > MAX_PROOF_LINES or any(len(h) != HASH_SIZE for h in proof):
        raise NoteError(f"a proof is at most {MAX_PROOF_LINES} hashes of {HASH_SIZE} bytes")
    lines = [f"old {old_size}\n", *(_b64(h) + "\n" for h in proof), "\n"]
    return "".join(lines).encode("ascii") + note


def parse_add_checkpoint(body: bytes) -> tuple[int, list[bytes], bytes]:
    """(old size, consistency proof, checkpoint note bytes) of an ``add-checkpoint`` body."""
    head, blank, note = body.partition(b"\n\n")
    if not blank:
        raise NoteError("the request has no blank line before the checkpoint")
    try:
        lines = head.decode("ascii").split("\n")
    except UnicodeDecodeError:
        raise NoteError("the request's old size and proof lines are not ASCII") from None
    old = lines[0]
    if not old.startswith("old ") or not _DECIMAL.fullmatch(old[4:]):
        raise NoteError("the request's first line is 'old <size>'")
    if len(lines) - 1 > MAX_PROOF_LINES:
        raise NoteError(f"a request carries at most {MAX_PROOF_LINES} proof lines")
    proof = [_b64decode(line, "a proof line") for line in lines[1:]]
    if any(len(h) != HASH_SIZE for h in proof):
        raise NoteError(f"each proof line is one {HASH_SIZE}-byte hash")
    return int(old[4:]), proof, note
