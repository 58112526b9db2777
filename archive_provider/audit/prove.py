"""``hermes-archive prove``: one memory disclosed with the proof that it is in the log.

Writes C2SP ``tlog-proof`` documents (FORMAT.md 21.1), one per event and one per file, all
naming the same signed checkpoint: the envelope, the disclosed bodies with their salts, the inclusion proof
from the tiles (O(log n) reads) and the checkpoint with its cosignatures. A recipient checks
it offline with the log's verifier key (``format/verifier.py proof FILE --key VKEY``) and
learns nothing about any body not disclosed: digests are salted, no store key travels.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from ..errors import InvalidRequest
from ..format import merkle, tlog_proof
from ..format.digests_v2 import envelope_of_row
from ..format.signed_note import Verifier
from ..storage.store import ENVELOPE_COLUMNS, EventStore, salted_payload
from ..storage.store_pieces import split_parts


class ProveError(InvalidRequest):
    """The proof cannot be made as asked (an unknown seq, nothing signed)."""


def proof_size(store: EventStore, last: int) -> int:
    """The checkpoint a proof of events up to ``last`` names: the newest one a witness has
    cosigned that covers them, else the newest signed one (0: none is signed)."""
    cosigned = store.conn.execute(
        "SELECT max(s.size) FROM signed_checkpoints s WHERE s.size >= ? "
        "AND EXISTS (SELECT 1 FROM cosignatures c WHERE c.size = s.size)",
        (last,),
    ).fetchone()[0]
    if cosigned is not None:
        return int(cosigned)
    return int(store.conn.execute("SELECT max(size) FROM signed_checkpoints").fetchone()[0] or 0)


def uncosigned(store: EventStore, last: int) -> str | None:
    """Why a proof of events up to ``last`` carries no cosignature; None when it does."""
    size = proof_size(store, last)
    if store.conn.execute("SELECT 1 FROM cosignatures WHERE size = ?", (size,)).fetchone():
        return None
    newest = store.conn.execute("SELECT max(size) FROM cosignatures").fetchone()[0]
    cosigned = f"the newest cosigned is size {newest}" if newest else "none is cosigned yet"
    return (
        f"no witness has cosigned a checkpoint that covers seq {last} ({cosigned}): witnesses "
        "cosign the checkpoints the provider signs while the agent runs, not those of a "
        "command's own writes; prove it again after the agent's next turn for a cosigned proof"
    )


def prove(store: EventStore, seqs: Sequence[int], only: Iterable[str] = ()) -> dict[int, bytes]:
    """One proof file per seq of ``seqs`` (every body named, or only the digests in ``only``),
    each one C2SP tlog-proof document, as stock parsers read it.

    A writable store first signs its head, so the newest events can be proven; each file is
    checked with the store's verifier key before it is returned. A disclosure that would
    make the ``extra`` line longer than a stock parser reads (64 KiB) is refused.
    """
    if not seqs:
        raise ProveError("name at least one seq to prove")
    store.checkpoint()
    size = proof_size(store, max(seqs))
    note = store.checkpoint_note(size) if size else None
    if note is None:
        raise ProveError("the archive has no signed checkpoint yet")
    wanted = {digest.lower() for digest in only}
    reader = merkle.TileReader(store.read_tile, size)
    documents: dict[int, bytes] = {}
    log = Verifier.from_vkey(store.note_vkey())
    for seq in dict.fromkeys(seqs):
        if not 1 <= seq <= size:
            raise ProveError(f"seq {seq} is not in the signed tree (size {size})")
        found = store.conn.execute(
            f"SELECT {ENVELOPE_COLUMNS} FROM events WHERE seq = ?", (seq,)
        ).fetchone()
        _, time, type_, session, key, identity, payload, parts, author, _ = found
        envelope = envelope_of_row(seq, time, type_, session, key, identity, payload, parts, author)
        named = [bytes(payload), *split_parts(parts)]
        named += [bytes(author)] if author is not None else []
        disclosed = []
        for digest in dict.fromkeys(named):
            if wanted and digest.hex() not in wanted:
                continue
            salted = salted_payload(store.conn, digest.hex())
            if salted is not None:  # an erased body stays a digest
                disclosed.append((digest, *salted))
        extra = tlog_proof.event_extra(envelope.canonical().decode("utf-8"), disclosed)
        if 4 * -(-len(extra) // 3) + len("extra \n") > tlog_proof.MAX_LINE:
            largest = max(disclosed, key=lambda d: len(d[2]), default=None)
            which = (
                f"the largest is {largest[0].hex()} ({len(largest[2]):,} bytes): disclose "
                "the others with --only"
                if largest is not None
                else "its envelope alone is that long"
            )
            raise ProveError(
                f"seq {seq}: the proof's extra line would pass 64 KiB, which stock C2SP "
                f"parsers refuse; {which}"
            )
        data = tlog_proof.TlogProof(
            seq - 1, tuple(merkle.inclusion_proof(seq - 1, size, reader)), note, extra
        ).encode()
        tlog_proof.verify_proof_file(data, log)
        documents[seq] = data
    return documents
