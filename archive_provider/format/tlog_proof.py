"""Proof files of ``hermes-archive prove`` (docs/FORMAT.md section 21.1), offline-checkable.

A proof file is one or more C2SP ``tlog-proof`` documents (``c2sp.org/tlog-proof@v1``), one
per proven event, all naming the same signed checkpoint. Each document's ``extra`` carries the
event's envelope text (whose UTF-8 bytes are the Merkle leaf) and the bodies disclosed with
their salts. Checking one needs only the log's verifier key and the witness keys one trusts.

Pure: no I/O; standard library, ``blake3`` and ``cryptography`` (through signed_note) only,
so the standalone verifier can use it as it is.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from blake3 import blake3

try:
    from . import merkle
    from .signed_note import Checkpoint, NoteError, Verifier, open_checkpoint
except ImportError:  # copied beside verifier.py and run as a script (FORMAT.md 21.1)
    import merkle  # type: ignore[no-redef]
    from signed_note import (  # type: ignore[no-redef]
        Checkpoint,
        NoteError,
        Verifier,
        open_checkpoint,
    )

HEADER = "c2sp.org/tlog-proof@v1"
DOMAIN_PAYLOAD = b"hermes-archive/v2/payload\x00"
ENVELOPE_FIELDS = frozenset(
    {"author", "identity", "key", "parts", "payload", "seq", "session", "time", "type"}
)
#: the longest line a stock parser reads, its newline included: Go's ``bufio.Scanner``
#: (the C2SP reference code's reader) stops at 64 KiB by default
MAX_LINE = 64 * 1024
_DECIMAL = re.compile(r"0|[1-9][0-9]*")
_HEX32 = re.compile(r"[0-9a-f]{64}")


class ProofFileError(ValueError):
    """A proof file is malformed or does not prove what it claims; the message says which,
    ``code`` which rule (FORMAT.md 21.1), ``seq`` the proven event's when known."""

    def __init__(self, message: str, code: str = "proof_format", seq: int | None = None) -> None:
        super().__init__(message)
        self.code, self.seq = code, seq


def payload_digest(salt: bytes, body: bytes) -> bytes:
    """The v2 payload commitment: BLAKE3(payload domain || salt || canonical body)."""
    if len(salt) != 32:
        raise ProofFileError("a salt is 32 bytes")
    return blake3(DOMAIN_PAYLOAD + salt + body).digest()


def strict_json(text: str | bytes) -> Any:
    """JSON with no member name twice and no NaN or infinities (FORMAT.md 20.1)."""

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        seen: dict[str, Any] = {}
        for name, value in items:
            if name in seen:
                raise ProofFileError(
                    f'a JSON object has the member "{name}" twice', "duplicate_key"
                )
            seen[name] = value
        return seen

    def constant(name: str) -> Any:
        raise ProofFileError(f"{name} is not a JSON number")

    try:
        return json.loads(text, object_pairs_hook=pairs, parse_constant=constant)
    except (ValueError, RecursionError) as exc:
        if isinstance(exc, ProofFileError):
            raise
        raise ProofFileError("the data is not valid JSON") from None


@dataclass(frozen=True)
class TlogProof:
    """One ``c2sp.org/tlog-proof@v1`` document."""

    index: int
    proof: tuple[bytes, ...]
    checkpoint: bytes  # the checkpoint note, signatures included
    extra: bytes | None = None

    def encode(self) -> bytes:
        lines = [HEADER]
        if self.extra is not None:
            lines.append("extra " + base64.b64encode(self.extra).decode("ascii"))
        lines.append(f"index {self.index}")
        lines.extend(base64.b64encode(h).decode("ascii") for h in self.proof)
        return ("\n".join(lines) + "\n\n").encode("ascii") + self.checkpoint


def _b64(text: str, what: str) -> bytes:
    try:
        return base64.b64decode(text.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError, ValueError):
        raise ProofFileError(f"{what} is not standard base64") from None


def parse_tlog_proofs(data: bytes) -> list[TlogProof]:
    """Split a proof file into its documents and parse each (at least one)."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise ProofFileError("a proof file is UTF-8 text") from None
    if not text.startswith(HEADER + "\n"):
        raise ProofFileError(f"a proof file starts with the line {HEADER}")
    longest = max(len(line.encode("utf-8")) + 1 for line in text.split("\n"))
    if longest > MAX_LINE:
        raise ProofFileError(
            f"a line of the proof file is {longest} bytes; stock parsers read at most {MAX_LINE}"
        )
    documents = text.split("\n" + HEADER + "\n")
    last = len(documents) - 1
    return [  # the split took the final newline of each note but the last one's
        _parse_document((doc if i == 0 else HEADER + "\n" + doc) + ("\n" if i < last else ""), i)
        for i, doc in enumerate(documents)
    ]


def _parse_document(text: str, number: int) -> TlogProof:
    where = f"proof document {number + 1}"
    head, blank, checkpoint = text.partition("\n\n")
    if not blank:
        raise ProofFileError(f"{where} has no blank line before its checkpoint")
    lines = head.split("\n")[1:]
    extra = None
    if lines and lines[0].startswith("extra "):
        extra = _b64(lines.pop(0)[len("extra ") :], f"{where}: the extra data")
    if not lines or not lines[0].startswith("index "):
        raise ProofFileError(f"{where} has no 'index' line")
    index_text = lines.pop(0)[len("index ") :]
    if not _DECIMAL.fullmatch(index_text):
        raise ProofFileError(f"{where}: the index is decimal with no leading zeros")
    proof = tuple(_b64(line, f"{where}: a proof line") for line in lines)
    if any(len(h) != merkle.HASH_SIZE for h in proof):
        raise ProofFileError(f"{where}: each proof line is one {merkle.HASH_SIZE}-byte hash")
    body = checkpoint.encode("utf-8")
    if not body.endswith(b"\n"):  # a note's text ends with a newline (signed-note)
        raise ProofFileError(f"{where}: the checkpoint note does not end with a newline")
    return TlogProof(int(index_text), proof, body, extra)


@dataclass(frozen=True)
class ProvenEvent:
    """What a checked proof document establishes."""

    seq: int
    envelope: dict[str, Any]
    checkpoint: Checkpoint
    cosigners: tuple[str, ...]
    disclosed: dict[str, bytes]  # digest (hex) -> canonical body bytes


def event_extra(envelope_text: str, payloads: Sequence[tuple[bytes, bytes, bytes]]) -> bytes:
    """The ``extra`` data of a proven event: its envelope text and (digest, salt, body)s."""
    value = {
        "envelope": envelope_text,
        "payloads": [
            {"body": body.decode("utf-8"), "digest": digest.hex(), "salt": salt.hex()}
            for digest, salt, body in payloads
        ],
    }
    # keys sorted, no whitespace, texts escaped as canonical text is (no surrogates here)
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def _envelope(text: str, where: str) -> dict[str, Any]:
    value = strict_json(text)
    if not isinstance(value, dict) or set(value) != ENVELOPE_FIELDS:
        raise ProofFileError(f"{where}: the envelope does not have the nine v2 fields")
    seq = value["seq"]
    if type(seq) is not int or seq < 1:
        raise ProofFileError(f"{where}: the envelope's seq is not a positive integer")
    digests = [value["identity"], value["payload"], *(value["parts"] or [])]
    if (
        not isinstance(value["parts"], list)
        or value["author"] is not None
        and not isinstance(value["author"], str)
    ):
        raise ProofFileError(f"{where}: the envelope's parts or author has the wrong type")
    if value["author"] is not None:
        digests.append(value["author"])
    if any(not isinstance(d, str) or not _HEX32.fullmatch(d) for d in digests):
        raise ProofFileError(f"{where}: an envelope digest is not 64 lowercase hex digits")
    return value


def verify_document(
    document: TlogProof, log: Verifier, witnesses: Sequence[Verifier] = ()
) -> ProvenEvent:
    """Check one document: signatures, inclusion of the envelope, and each disclosed body."""
    where, seq = f"the proof of leaf {document.index}", document.index + 1
    try:
        checkpoint, _, cosigned = open_checkpoint(document.checkpoint, log, witnesses)
    except NoteError as exc:
        raise ProofFileError(
            f"{where}: the checkpoint does not verify: {exc}", "checkpoint_signature"
        ) from None
    if document.extra is None:
        raise ProofFileError(f"{where} carries no envelope (no extra line)")
    try:
        extra = strict_json(document.extra.decode("utf-8"))
    except UnicodeDecodeError:
        raise ProofFileError(f"{where}: the extra data is not UTF-8") from None
    if not isinstance(extra, dict) or set(extra) != {"envelope", "payloads"}:
        raise ProofFileError(f"{where}: the extra data is not an envelope and its payloads")
    text, payloads = extra["envelope"], extra["payloads"]
    if not isinstance(text, str) or not isinstance(payloads, list):
        raise ProofFileError(f"{where}: the extra data has the wrong types")
    envelope = _envelope(text, where)
    if envelope["seq"] != document.index + 1:
        raise ProofFileError(
            f"{where}: the envelope is seq {envelope['seq']}, the proof is for seq "
            f"{document.index + 1}"
        )
    leaf = merkle.leaf_hash(text.encode("utf-8"))
    try:
        merkle.verify_inclusion(
            document.index, checkpoint.size, leaf, document.proof, checkpoint.root
        )
    except merkle.ProofError as exc:
        raise ProofFileError(
            f"{where}: the envelope is not in the signed tree: {exc}", "inclusion", seq
        ) from None
    named = {envelope["payload"], *envelope["parts"], envelope["author"]} - {None}
    disclosed: dict[str, bytes] = {}
    for entry in payloads:
        if not isinstance(entry, dict) or set(entry) != {"body", "digest", "salt"}:
            raise ProofFileError(f"{where}: a disclosed payload is not a body, digest and salt")
        digest, salt, body = entry["digest"], entry["salt"], entry["body"]
        if not all(isinstance(x, str) for x in (digest, salt, body)) or not (
            _HEX32.fullmatch(digest) and _HEX32.fullmatch(salt)
        ):
            raise ProofFileError(f"{where}: a disclosed payload has the wrong form")
        if digest not in named:
            raise ProofFileError(f"{where}: payload {digest} is not named by the envelope")
        data = body.encode("utf-8")
        if payload_digest(bytes.fromhex(salt), data).hex() != digest:
            raise ProofFileError(
                f"{where}: payload {digest} does not match its body and salt",
                "payload_mismatch",
                seq,
            )
        disclosed[digest] = data
    return ProvenEvent(
        envelope["seq"], envelope, checkpoint, tuple(s.name for s in cosigned), disclosed
    )


def verify_proof_file(
    data: bytes, log: Verifier, witnesses: Sequence[Verifier] = ()
) -> list[ProvenEvent]:
    """Check every document of a proof file; all must name the same checkpoint."""
    proven = [verify_document(doc, log, witnesses) for doc in parse_tlog_proofs(data)]
    if len({(p.checkpoint.size, p.checkpoint.root) for p in proven}) != 1:
        raise ProofFileError("the documents of a proof file name different checkpoints")
    return proven
