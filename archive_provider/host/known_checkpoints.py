"""Checkpoints this process committed, recognised by what the host handed over.

A host retries ``on_pre_compress`` with the same transcript (its summariser failed, a
second compression pass). The full path re-runs redaction and resolves every evidence
message against the payloads table on the writer thread, about 75 µs a message, only to
find the identity already archived. The retry can instead be recognised before any of
that: the digest of (session, redaction setting, the archivable evidence rows) names the
checkpoint event this process committed for exactly that input, and two reads on the
reader connection show that the record and its evidence still stand.

Memory only: a new process takes the full path once, then remembers. Nothing is written
on a recognised retry, and it was durable when first returned (a FULL commit). This is the
one place a retry is recognised: below it, the writer moves the witness only after a
durable commit that moved the head (a retry on the full path appends nothing, so there is
nothing to witness), and ``checkpoint_proof.advance`` has no retry case of its own.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from collections import OrderedDict
from typing import Any

from blake3 import blake3

from ..format import digests_v2
from ..storage.sql import select_in
from ..storage.store_pieces import split_parts

#: how many recent checkpoints are remembered (a host retries its latest ones)
KEPT = 64


def recognition_key(session: str, redact: bool, evidence: list[dict[str, Any]]) -> bytes | None:
    """A digest that differs whenever the checkpoint's identity could (None: cannot tell).

    The identity covers the session and the digests of the redacted evidence rows, which
    are a function of the archivable rows and the redaction setting; the JSON of
    archivable values is injective, so equal keys mean an equal identity.
    """
    try:
        text = json.dumps(
            [session, redact, evidence],
            ensure_ascii=True,
            sort_keys=True,
            separators=(",", ":"),
            allow_nan=False,
        )
    except (TypeError, ValueError):
        return None
    return blake3(text.encode("ascii")).digest()


def still_stands(conn: sqlite3.Connection, seq: int, identity: str) -> bool:
    """Whether the checkpoint at ``seq`` still is ``identity`` with every evidence body whole.

    One read of the event and one of its parts' rows, no per-message probe: the identity is
    recomputed from the row (a rolled-back, replaced or edited log no longer matches), and
    each part's stored body must still hash to its salted digest (an edited body fails, an
    erased one has none). Either way the full path then decides: it fails closed on an edit
    and re-archives what the host still holds after an erasure. Format v2 only (a v1 log's
    parts are keyed digests; it takes the full path).
    """
    row = conn.execute(
        "SELECT type, session, key, identity, parts FROM events WHERE seq = ?", (seq,)
    ).fetchone()
    if row is None or not isinstance(row[3], bytes) or not isinstance(row[4], bytes):
        return False
    type_, session, key, stored, blob = row
    if stored.hex() != identity or digests_v2.identity(
        type_, session, key, digests_v2.parts_from_blob(blob)
    ) != bytes(stored):
        return False
    wanted = set(split_parts(blob))
    found: set[bytes] = set()
    for digest, salt, body in select_in(
        conn, "SELECT digest, salt, body FROM payloads WHERE digest IN ({})", wanted
    ):
        if not isinstance(salt, bytes) or not isinstance(body, bytes):
            return False
        if digests_v2.payload_digest(salt, body) != digest:
            return False
        found.add(bytes(digest))
    return found == wanted


class KnownCheckpoints:
    """Recognition key -> (seq, identity) of the checkpoints committed in this process."""

    def __init__(self) -> None:
        self._seen: OrderedDict[bytes, tuple[int, str]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: bytes) -> tuple[int, str] | None:
        with self._lock:
            return self._seen.get(key)

    def remember(self, key: bytes, seq: int, identity: str) -> None:
        """Record a checkpoint whose durable commit has returned (never before)."""
        with self._lock:
            self._seen[key] = (seq, identity)
            self._seen.move_to_end(key)
            while len(self._seen) > KEPT:
                self._seen.popitem(last=False)

    def forget(self, key: bytes) -> None:
        with self._lock:
            self._seen.pop(key, None)
