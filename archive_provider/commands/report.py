"""report: one self-contained HTML page of what happened in the archive and whether it is whole.

Streams the log once through the store's reader into :class:`ReportReducer` (bounded memory),
verifies the log at report time, reads the newest signed checkpoint with its cosignatures
and each witness's lag, and writes the page (docs/AUDIT.md, "The audit report"). With
``--db URL --store ID`` it reports on one archive of a central store.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from archive_provider.commands import CommandContext, UsageError, expanded

if TYPE_CHECKING:
    from archive_provider.audit.report import Fact
    from archive_provider.storage.store import EventStore

NAME = "report"
HELP = "write an audit report: one self-contained HTML page (timeline, sessions, proofs)"

#: authors' labels kept by digest while streaming (a few hosts write many turns)
AUTHOR_CACHE = 4096


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("out", metavar="OUT.html", help="the page to write")
    parser.add_argument("--force", action="store_true", help="replace OUT if it exists")
    parser.add_argument(
        "--key",
        metavar="VKEY",
        help="the archive's verifier key, pinned outside it (`hermes-archive key` "
        "printed it), to check every signed checkpoint, as `verify --key` does",
    )


def _facts(store: EventStore) -> Iterator[Fact]:
    """Each event of the log as a fact, oldest first, with its line and what it needs
    looked up (turns and memory writes stream with their parts' bodies)."""
    from archive_provider.audit.report import fact_of
    from archive_provider.audit.summary import author_text, part, summary
    from archive_provider.storage.sql import select_in
    from archive_provider.storage.store import iter_events

    authors: dict[str, str] = {}
    lookup = store.conn.cursor()
    last = 0
    for event in iter_events(store.conn, part_types=("memory_write",)):
        if event.seq > last + 1:  # the reader skips events whose body was erased
            yield from _erased_facts(store, last, event.seq)
        last = event.seq
        body, author, content = event.body, None, None
        sources: tuple[tuple[int, str], ...] = ()
        if event.type == "turn" and event.author_digest:
            digest = event.author_digest
            if digest not in authors:
                if len(authors) >= AUTHOR_CACHE:
                    authors.clear()
                authors[digest] = author_text(store, event)
            author = authors[digest]
        elif event.type == "memory_write" and isinstance(body, dict):
            content = part(store, body.get("content"), event)
        elif event.type == "recall_served" and isinstance(body, dict):
            wanted = {s for s in body.get("sources") or () if isinstance(s, int)}
            sources = tuple(
                sorted(
                    (int(seq), str(session))
                    for seq, session in select_in(
                        lookup, "SELECT seq, session FROM events WHERE seq IN ({})", wanted
                    )
                )
            )
        yield fact_of(
            event.seq,
            event.time,
            event.type,
            event.session,
            body,
            summary(store, event, author=author),
            author=author,
            memory_content=content,
            sources=sources,
        )
    yield from _erased_facts(store, last)


def _erased_facts(store: EventStore, after: int, before: int | None = None) -> Iterator[Fact]:
    """The events between two read ones whose body an erasure removed: the envelope stays,
    so the report still counts and shows them (as erased)."""
    from archive_provider.audit.report import fact_of
    from archive_provider.audit.summary import envelope_summary

    sql = "SELECT seq, time, type, session, payload FROM events WHERE seq > ?"
    args: list[int] = [after]
    if before is not None:
        sql += " AND seq < ?"
        args.append(before)
    for seq, time, kind, session, payload in store.conn.execute(
        sql + " ORDER BY seq", args
    ).fetchall():
        digest = payload.hex() if isinstance(payload, bytes) else str(payload)
        line = envelope_summary(store, str(kind), digest)
        yield fact_of(int(seq), str(time), str(kind), str(session), None, line, erased=True)


def _checkpoint(store: EventStore) -> dict[str, Any] | None:
    """The newest signed checkpoint: origin, size, root, who signed and who cosigned."""
    from archive_provider.format.signed_note import NoteError, parse_checkpoint, parse_note

    note = store.checkpoint_note()
    if note is None:
        return None
    parsed = parse_note(note)
    checkpoint = parse_checkpoint(parsed.text)
    cosigners = []
    for signature in parsed.signatures[1:]:  # the log's own line comes first
        try:
            at = datetime.fromtimestamp(signature.timestamp, timezone.utc).isoformat()
        except (NoteError, OverflowError, OSError, ValueError):
            at = None
        cosigners.append({"name": signature.name, "time": at})
    return {
        "origin": checkpoint.origin,
        "size": checkpoint.size,
        "root": checkpoint.root.hex(),
        "signers": [parsed.signatures[0].name],
        "cosigners": cosigners,
    }


def _witnesses(ctx: CommandContext, store: EventStore) -> list[dict[str, Any]]:
    """The local witness and each remote one: what it cosigned and how far it lags."""
    from archive_provider.commands.status import witness_status

    found = witness_status(ctx, store)
    head = store.head().seq
    rows = []
    local = found.get("local_witness")
    if local is not None:
        size = local.get("cosigned_size")
        state = "ok" if local["ok"] else f"REFUSED: {local['problem']}"
        rows.append(
            {
                "name": "local witness",
                "cosigned_size": size,
                "behind": None if size is None else head - size,
                "state": state if size is not None or not local["ok"] else "nothing cosigned yet",
            }
        )
    for row in found.get("remote_witnesses", ()):
        if row.get("consistent") is False:
            state = f"REFUSES this archive: {row.get('error')}"
        else:
            state = f"last error: {row['error']}" if row.get("error") else "ok"
        rows.append(
            {
                "name": row.get("name"),
                "cosigned_size": row.get("cosigned_size"),
                "behind": row.get("behind"),
                "state": state,
            }
        )
    return rows


def build_model(ctx: CommandContext, store: EventStore) -> dict[str, Any]:
    """Everything the page shows, read from ``store`` now (verification included)."""
    from archive_provider.audit.report import ReportReducer
    from archive_provider.domain.clock import now_text
    from archive_provider.format.digests_v2 import FORMAT_VERSION
    from archive_provider.format.verifier import usable_cores, verify_database

    generated = now_text()
    head = store.head()
    with ctx.progress("verify", head.seq) as progress:
        verified = verify_database(
            store.conn, store.key, progress=progress, vkey=ctx.args.key, jobs=usable_cores()
        )
    reducer = ReportReducer()
    for fact in _facts(store):
        reducer.add(fact)
    central = getattr(ctx, "central_store_id", "")
    return reducer.model(
        generated=generated,
        archive={
            "store_id": central or store.store_id,
            "format_version": FORMAT_VERSION,
            "head_seq": head.seq,
            "head_chain": head.chain,
            "central": bool(central),
        },
        verification={
            key: value
            for key, value in verified.as_dict().items()
            if key
            in ("ok", "events_checked", "payloads_checked", "last_seq", "first_bad_seq", "problem")
        }
        | {"warnings": list(verified.warnings)},
        checkpoint=_checkpoint(store),
        witnesses=_witnesses(ctx, store),
    )


def run(ctx: CommandContext) -> int:
    from archive_provider.audit.report import render_html
    from archive_provider.storage.safe_files import write_private_file

    out = expanded(ctx.args.out)
    if out.is_symlink() or (out.exists() and not out.is_file()):
        raise UsageError(f"{out} is not a regular file; give a new file name for the report")
    if out.exists() and not ctx.args.force:
        raise UsageError(f"{out} exists; choose another path or pass --force")
    with ctx.store() as store:
        model = build_model(ctx, store)
    page = render_html(model).encode("utf-8")
    write_private_file(out, page)
    ok = bool(model["verification"]["ok"])
    ctx.emit(
        {"ok": ok, "path": str(out), "bytes": len(page), "events": model["events"]},
        lambda _: (
            f"Wrote {out} ({len(page):,} bytes, {model['events']:,} events): the log "
            + (
                "verified"
                if ok
                else "FAILED verification: " + str(model["verification"]["problem"])
            )
        ),
    )
    return 0 if ok else 1
