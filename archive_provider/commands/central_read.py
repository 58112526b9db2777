"""The reading commands against a central store: ``hermes-archive --db URL status | verify |
log | show | search | history | as-of | export | prove`` (with ``--store ID`` for one
archive).

Same filters, same event records and the same verifier as against a local file: ``verify``
runs the verifier over the central rows (``central.verify_store``); ``log`` and ``show``
render with ``_render``; ``search`` uses PostgreSQL's full-text search over the payloads
(the server computes the vectors on insert). ``history``, ``as-of``, ``export`` and
``prove`` need one archive's projections, tiles and checkpoints: the store is laid
out as an archive in a private temporary folder (``central.lay_out_archive``, one read of that
store), its projections are replayed there, and the local command runs on that copy.
"""

from __future__ import annotations

import os
import secrets
import sqlite3
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from archive_provider.audit.summary import fields, preview
from archive_provider.commands import CommandContext, CommandError, UsageError
from archive_provider.commands._render import event_table, record, short_time

if TYPE_CHECKING:
    from archive_provider.storage.store import EventStore

_EVENT_SELECT = (
    "SELECT e.store_id, e.seq, e.time, e.type, e.session, e.key, e.identity, e.payload, "
    "e.parts, e.chain, e.author, p.erased_by, p.body "
    "FROM hermes_archive.events e "
    "LEFT JOIN hermes_archive.payloads p ON p.store_id = e.store_id AND p.digest = e.payload"
)


class CentralView:
    """What the renderers read from an archive (payload bodies), for one central store."""

    def __init__(self, conn: Any, store_id: str) -> None:
        from archive_provider.fleet.central import payload_reader

        self.store_id = store_id
        self._read = payload_reader(conn, store_id)

    def payload(self, digest: str) -> bytes | None:
        return self._read(digest)


@contextmanager
def _connection(ctx: CommandContext) -> Iterator[Any]:
    from archive_provider.fleet.central import CentralError, connect

    try:
        conn = connect(ctx.db or "")
    except CentralError as exc:
        raise CommandError(str(exc)) from None
    try:
        yield conn
    finally:
        conn.close()


def _event(row: tuple[Any, ...]) -> Any:
    """A central row (of :data:`_EVENT_SELECT`) as the event the renderers take."""
    from archive_provider.format.digests import Envelope
    from archive_provider.format.digests_v2 import FORMAT_VERSION
    from archive_provider.format.events import LoadedEvent

    seq, time, type_, session, key, identity, payload, parts, chain, author = row[1:11]
    erased_by, body = row[11:13]
    envelope = Envelope(
        seq, time, type_, session, key, identity, payload, parts, author, FORMAT_VERSION
    )
    if body is None:  # an erased payload: the envelope stays, the body is gone
        body = f'"(erased by the erasure event at seq {erased_by})"'.encode()
    return LoadedEvent(envelope, chain, bytes(body))


def _record(conn: Any, row: tuple[Any, ...], *, full: bool = False) -> dict[str, Any]:
    data = record(CentralView(conn, row[0]), _event(row), full=full)
    return {"store_id": row[0], **data}


def status(ctx: CommandContext) -> int:
    from archive_provider.fleet.central import redacted, summary

    with _connection(ctx) as conn:
        stores = summary(conn, ctx.central_store)
    data = {"central": redacted(ctx.db or ""), "stores": stores}

    def human(data: dict[str, Any]) -> str:
        lines = [f"Central store: {data['central']}", f"Archives: {len(data['stores'])}"]
        for s in data["stores"]:
            lines.append(
                f"  {s['store_id']}  {s['label'] or '-'} (by {s['shipper']}, format "
                f"{s['format_version']})  events {s['events']}  "
                f"payloads {s['payloads']} ({s['erased_payloads']} erased)  "
                f"last event {s['last_event_time'] or '-'}  last shipped {s['last_shipped'] or '-'}"
            )
        return "\n".join(lines)

    ctx.emit(data, human)
    return 0


def _chosen(conn: Any, ctx: CommandContext) -> list[Any]:
    """The stores ``--store`` names (all without it); naming none that exists is an error of
    its own, never "nothing matches" about what was asked of it."""
    from archive_provider.fleet.central import stores

    chosen = stores(conn, ctx.central_store)
    if ctx.central_store and not chosen:
        raise CommandError(f"no store {ctx.central_store!r} in the central store")
    return chosen


def verify(ctx: CommandContext) -> int:
    from archive_provider.fleet.central import verify_store

    if getattr(ctx.args, "projections", False):
        raise UsageError("--projections applies to a local archive; the central store has none")
    results = []
    with _connection(ctx) as conn:
        chosen = _chosen(conn, ctx)
        if ctx.args.key and len(chosen) != 1:
            raise UsageError("--key pins one archive's key: name it with --store ID")
        for store in chosen:
            with ctx.progress(f"verify {store.store_id[:8]}", 0) as progress:
                report = verify_store(
                    conn,
                    store,
                    progress,
                    vkey=ctx.args.key,
                    witness_keys=ctx.args.witness_key or (),
                )
            results.append({"store_id": store.store_id, "label": store.label, **report.as_dict()})
    ok = all(r["ok"] for r in results)
    data = {"ok": ok, "stores": results}

    def human(data: dict[str, Any]) -> str:
        if not data["stores"]:
            return "No archives in the central store yet."
        lines = []
        for r in data["stores"]:
            name = f"{r['store_id']} ({r['label']})" if r["label"] else r["store_id"]
            if r["ok"]:
                lines.append(
                    f"ok: {name}: {r['events_checked']} events and {r['payloads_checked']} "
                    f"payloads verified; head at seq {r['last_seq']}"
                )
                cosigned = ", ".join((r["checkpoint"] or {}).get("cosigned_by") or [])
                lines.append(
                    f"  tree of {r['tree_size']} events, root {r['root']}; signed "
                    f"checkpoints: {r['authenticity']}"
                    + (f"; newest cosigned by {cosigned}" if cosigned else "")
                )
                lines.extend(
                    f"  erasure at seq {e['seq']}: {e['payloads']} payloads erased"
                    for e in r["erasures"]
                )
            else:
                where = (
                    f"seq {r['first_bad_seq']}" if r["first_bad_seq"] is not None else "the store"
                )
                lines.append(f"FAILED: {name} at {where}: {r['problem']}")
            lines.extend(f"  note: {w}" for w in r["warnings"])
        return "\n".join(lines)

    ctx.emit(data, human)
    return 0 if ok else 1


def log(ctx: CommandContext) -> int:
    from archive_provider.commands.log import query

    where, params = query(ctx)  # the local command's filters, with PostgreSQL's placeholders
    clauses = [where.replace(" WHERE ", "", 1).replace("?", "%s")] if where else []
    if ctx.central_store:
        clauses.append("e.store_id LIKE %s")
        params.append(ctx.central_store.lower() + "%")
    sql = (
        _EVENT_SELECT
        + (" WHERE " + " AND ".join(clauses) if clauses else "")
        + " ORDER BY e.time DESC, e.store_id, e.seq DESC LIMIT %s"
    )
    with _connection(ctx) as conn:
        _chosen(conn, ctx)
        rows = conn.execute(sql, [*params, ctx.args.limit or None]).fetchall()
        events = [_record(conn, row) for row in reversed(rows)]

    ctx.emit(events, event_table)
    return 0 if events else 1


def show(ctx: CommandContext) -> int:
    from archive_provider.commands.show import _human

    ref = ctx.args.event
    with _connection(ctx) as conn:
        _chosen(conn, ctx)
        if ref.isdigit() and len(ref) <= 18:
            if not ctx.central_store:
                raise UsageError("with --db, a sequence number needs --store ID")
            rows = conn.execute(
                _EVENT_SELECT + " WHERE e.store_id LIKE %s AND e.seq = %s ORDER BY e.store_id",
                [ctx.central_store.lower() + "%", int(ref)],
            ).fetchall()
        else:
            prefix = ref.lower()
            if len(prefix) < 4 or any(c not in "0123456789abcdef" for c in prefix):
                raise UsageError(
                    f"{ref!r} is neither a sequence number nor a hex digest prefix (4 to 64 digits)"
                )
            rows = conn.execute(
                _EVENT_SELECT + " WHERE (e.identity LIKE %s OR e.payload LIKE %s) "
                "AND e.store_id LIKE %s ORDER BY e.store_id, e.seq LIMIT 20",
                [prefix + "%", prefix + "%", (ctx.central_store or "").lower() + "%"],
            ).fetchall()
        events = [_record(conn, row, full=True) for row in rows]
    if not events:
        return ctx.fail(f"no event matches {ref!r}")
    ctx.emit({"query": ref, "events": events}, _human)
    return 0


def _text(body: bytes | None) -> str:
    """A matched body as people read it: a message's text, a memory entry, a value's text
    (never its JSON encoding, nor markup), as the local search prints it."""
    from archive_provider.domain.evidence import message_text
    from archive_provider.format.canonical import decode

    if body is None:
        return ""
    value = decode(bytes(body))
    if isinstance(value, dict):
        return message_text(value) or fields(value)
    return value if isinstance(value, str) else str(value)


def search(ctx: CommandContext) -> int:
    """PostgreSQL full-text search (english configuration) over payload bodies."""
    from archive_provider.format.verifier import printable

    text = " ".join(ctx.args.query)
    filters, args = [], []
    for clause, value in (
        ("e.session = %s", ctx.args.session),
        ("e.time >= %s", ctx.args.since),
        ("e.time <= %s", ctx.args.until),
    ):
        if value is not None:
            filters.append(clause)
            args.append(value)
    sql = f"""
        SELECT h.store_id, e.seq, e.time, e.type, e.session, h.rank, h.body
          FROM (SELECT p.store_id, p.digest, p.body, q, ts_rank(p.search, q) AS rank
                  FROM hermes_archive.payloads p, plainto_tsquery('english', %s) q
                 WHERE p.search @@ q AND p.store_id LIKE %s) h
          CROSS JOIN LATERAL (
              SELECT e.seq, e.time, e.type, e.session FROM hermes_archive.events e
               WHERE e.store_id = h.store_id
                 AND (e.payload = h.digest OR e.parts::jsonb ? h.digest)
                 {"".join(" AND " + f for f in filters)}
               ORDER BY e.seq LIMIT 1) e
         ORDER BY h.rank DESC, e.time DESC LIMIT %s"""
    with _connection(ctx) as conn:
        _chosen(conn, ctx)
        rows = conn.execute(
            sql, [text, (ctx.central_store or "").lower() + "%", *args, ctx.args.limit or 10]
        ).fetchall()
    results = [
        {
            **dict(
                zip(("store_id", "seq", "time", "type", "session", "rank"), row[:6], strict=True)
            ),
            "text": _text(row[6]),
        }
        for row in rows
    ]
    data = {"query": text, "results": results}

    def human(data: dict[str, Any]) -> str:
        if not data["results"]:
            return f"Nothing in the central store matches {text!r}."
        return "\n".join(
            f"{h['store_id'][:8]}  {h['seq']:>6}  {short_time(h['time'])}  {h['type']:<10}  "
            f"{printable(h['session'])}  {preview(h['text'], 80)}"
            for h in data["results"]
        )

    ctx.emit(data, human)
    return 0 if results else 1


class _LaidOut(CommandContext):
    """A context whose archive is a central store laid out in a temporary folder."""

    registered_vkey: str = ""
    #: the central store's id (a report names it in the commands it links)
    central_store_id: str = ""

    def open_store(self) -> EventStore:
        store = super().open_store()
        store.registered_vkey = self.registered_vkey  # it has no signing key of its own
        return store


@contextmanager
def _laid_out(ctx: CommandContext, name: str) -> Iterator[CommandContext]:
    """One central store as a local archive (read-only) for a local command."""
    from archive_provider.audit.replay import rebuild_connection
    from archive_provider.fleet.central import lay_out_archive, stores
    from archive_provider.projections.registry import default_projections
    from archive_provider.storage.store import DB_NAME, archive_dir
    from archive_provider.storage.store_pieces import STORE_KEY_NAME, write_private

    if not ctx.central_store:
        raise UsageError(f"with --db, `{name}` reads one archive: give --store ID")
    with _connection(ctx) as conn, tempfile.TemporaryDirectory(prefix="hermes-archive-") as tmp:
        found = stores(conn, ctx.central_store)
        if len(found) != 1:
            raise CommandError(
                f"--store {ctx.central_store!r} names {len(found)} archives of the central "
                "store; give more of its id"
            )
        store = found[0]
        folder = archive_dir(Path(tmp))
        folder.mkdir(mode=0o700)
        # a lookup key of its own: the copy is never written, so it only has to exist
        write_private(folder / STORE_KEY_NAME, secrets.token_hex(32) + "\n")
        os.close(os.open(folder / DB_NAME, os.O_WRONLY | os.O_CREAT, 0o600))
        db = sqlite3.connect(folder / DB_NAME, isolation_level=None)
        try:
            conn.rollback()  # one snapshot for the whole copy
            conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
            problem = lay_out_archive(conn, store, db, None)
            conn.rollback()
            if problem is not None:
                raise CommandError(
                    f"store {store.store_id} cannot be read: {problem[1]} "
                    "(hermes-archive --db URL verify --store ID)"
                )
            db.execute("BEGIN")
            rebuild_connection(db, default_projections(db))
            db.execute("COMMIT")
        finally:
            db.close()
        local = _LaidOut(**{**vars(replace(ctx, home=Path(tmp), db=None, central_store=None))})
        local.registered_vkey = store.vkey
        local.central_store_id = store.store_id
        yield local


def _on_copy(name: str, reading: tuple[str, ...] = ()) -> Callable[[CommandContext], int]:
    """The local command ``name``, run on one central store laid out as an archive; of a
    command with actions, only the ``reading`` ones (the others write to an archive)."""

    def run(ctx: CommandContext) -> int:
        from importlib import import_module

        action = getattr(ctx.args, "action", None)
        if reading and action not in reading:
            raise UsageError(
                f"`{name} {action}` writes to an archive: run it on the host that keeps it "
                "(its events reach the central store by shipping)"
            )
        module = import_module(f"archive_provider.commands.{name}")
        with _laid_out(ctx, name.replace("_", "-")) as local:
            code: int = module.run(local)
        return code

    return run


RUNNERS: dict[str, Callable[[CommandContext], int]] = {
    "status": status,
    "verify": verify,
    "log": log,
    "show": show,
    "search": search,
    "history": _on_copy("history"),
    "as-of": _on_copy("as_of"),
    "export": _on_copy("export"),
    "prove": _on_copy("prove"),
    "hold": _on_copy("hold", reading=("list",)),
    "retention": _on_copy("retention", reading=("show",)),
    "erasures": _on_copy("erasures"),
    "report": _on_copy("report"),
}


def runner_for(name: str) -> Callable[[CommandContext], int]:
    """The central version of command ``name``; a usage error when it has none yet."""
    try:
        return RUNNERS[name]
    except KeyError:
        raise UsageError(
            f"`{name}` does not read a central store (--db works with {', '.join(sorted(RUNNERS))})"
        ) from None
