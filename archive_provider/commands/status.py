"""status: what the archive holds, its head (the value to write down) and projection health."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from archive_provider.commands import CommandContext

if TYPE_CHECKING:  # loaded when the command runs: building the parser stays cheap
    from archive_provider.storage.store import EventStore

#: the store-level events, recorded under the session "archive" (FORMAT.md 18): no conversation
STORE_EVENTS = (
    "('store_created', 'migrated_from', 'erasure', 'legal_hold', 'legal_hold_released', "
    "'retention_policy', 'witness_added', 'witness_removed')"
)

NAME = "status"
HELP = "summarize the archive: events, sessions, checkpoints, head, size, projection health"


def configure(parser: argparse.ArgumentParser) -> None:
    """No options."""


def _spill(ctx: CommandContext) -> dict[str, Any]:
    """What waits in the spill for the next open, and damaged segments kept aside."""
    from archive_provider.storage.spill import pending

    waiting = pending(ctx.archive)
    return {"segments": waiting.segments, "bytes": waiting.bytes, "damaged": waiting.damaged}


def collect(ctx: CommandContext) -> dict[str, Any]:
    from archive_provider.fleet.ship import at_local_head, read_state
    from archive_provider.projections.registry import default_projections
    from archive_provider.projections.runner import to_rebuild
    from archive_provider.storage.outside import inside_problems
    from archive_provider.storage.store import DB_NAME

    refused = inside_problems(ctx.home)  # protection variables set from inside the profile
    if not ctx.exists():
        return {
            "archive": str(ctx.archive),
            "exists": False,
            "spill": _spill(ctx),
            "refused_variables": refused,
        }
    with ctx.store() as store:
        conn = store.conn
        conn.execute("BEGIN")  # one snapshot: the counts and the head agree
        try:
            head = store.head()
            meta = dict(conn.execute("SELECT name, value FROM meta").fetchall())
            counts = dict(
                conn.execute("SELECT type, count(*) FROM events GROUP BY type").fetchall()
            )
            last = conn.execute(
                "SELECT seq, time, type, session FROM events ORDER BY seq DESC LIMIT 1"
            ).fetchone()
            has_state = conn.execute(
                "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'projection_state'"
            ).fetchone()
            projections = (
                dict(conn.execute("SELECT name, last_seq FROM projection_state").fetchall())
                if has_state
                else {}
            )
            rebuild = set(to_rebuild(conn, default_projections(conn))) if has_state else set()
            recall = recall_check(store) if has_state else None
            sessions = conn.execute(  # '' is no conversation (peer and witness events), nor
                "SELECT count(DISTINCT session) FROM events WHERE session != '' AND NOT ("
                f"session = 'archive' AND type IN {STORE_EVENTS})"  # the store-level events
            ).fetchone()[0]
            drain = last_drain(store) if counts.get("shutdown_drain") else None
            shipping = read_state(ctx.archive)
            if shipping is not None:  # the lag from the local head, not the last pass's
                shipping = at_local_head(shipping, store)
        finally:
            conn.execute("COMMIT")
        witnesses = witness_status(ctx, store)
    size = sum(p.stat().st_size for p in ctx.archive.iterdir() if p.name.startswith(DB_NAME))
    return {
        "archive": str(ctx.archive),
        "exists": True,
        "store_id": meta.get("store_id"),
        "format_version": int(meta.get("format_version", 0)),
        "created": meta.get("created"),
        "head": {"seq": head.seq, "chain": head.chain},
        "events": head.seq,
        "events_by_type": counts,
        "sessions": sessions,
        "checkpoints": counts.get("checkpoint", 0),
        "last_event": dict(zip(("seq", "time", "type", "session"), last, strict=True))
        if last
        else None,
        "bytes": size,
        "spill": _spill(ctx),
        "projections": {
            name: {
                "last_seq": seq,
                "current": seq == head.seq and name not in rebuild,
                "rebuild": name in rebuild,  # stored by an older release
            }
            for name, seq in sorted(projections.items())
        },
        "shipping": shipping,
        "shipping_required": _shipping_required(ctx, shipping),
        "recall": recall,
        "last_unfinished_drain": drain,
        "refused_variables": refused,
        **witnesses,
    }


def _shipping_required(
    ctx: CommandContext, shipping: dict[str, Any] | None
) -> dict[str, Any] | None:
    """Required shipping (the ``ship_required`` setting), from the shipping state read
    already: met, or why not in one line."""
    from archive_provider.host.settings import settings_and_problems
    from archive_provider.host.shipping import requirement

    found = requirement(settings_and_problems(ctx.home)[0], shipping)
    return None if found is None else {"met": found[1], "line": found[0]}


def last_drain(store: EventStore) -> dict[str, Any] | None:
    """The newest ``shutdown_drain``: a shutdown that left hook calls queued (HOST.md §3)."""
    row = store.conn.execute(
        "SELECT seq FROM events WHERE type = 'shutdown_drain' ORDER BY seq DESC LIMIT 1"
    ).fetchone()
    event = store.event(int(row[0])) if row else None
    if event is None:
        return None
    return {"seq": event.seq, "time": event.time, **dict(event.body)}


def drain_line(drain: dict[str, Any]) -> str:
    """One line on the last shutdown whose drain did not finish."""
    lost = (
        f"{drain['unwritten']} lost ("
        + ", ".join(f"{k} {v}" for k, v in sorted(drain["unwritten_hooks"].items()))
        + ")"
        if drain["unwritten"]
        else "none lost"
    )
    return (
        f"Last unfinished shutdown drain: seq {drain['seq']} at {drain['time']}: "
        f"{drain['pending']} hook calls still queued after {drain['timeout_s']:g} s, "
        f"{drain['spilled']} spilled and archived on the next open, {lost}"
        + (f"; writer error: {drain['error']}" if drain.get("error") else "")
    )


#: how long ``status`` waits for each remote witness (``verify --witnesses`` waits longer)
STATUS_WITNESS_TIMEOUT_S = 2.0


def witness_status(ctx: CommandContext, store: EventStore, timeout: float = 0.0) -> dict[str, Any]:
    """The local witness (cosigned size, the background walk) and each remote witness's
    lag: what it last cosigned (asked over the network) against the head, and why it lags."""
    from archive_provider.storage.witness import Witness, WitnessMismatch
    from archive_provider.witnesses.remote import check_remote

    witness = Witness.for_home(ctx.home)
    local: dict[str, Any] = {"path": str(witness.path)}
    try:
        record = witness.read_for(store.store_id)
        witness.check(store.conn, store.store_id)
        local["ok"], local["problem"] = True, None
    except WitnessMismatch as exc:
        record, local["ok"], local["problem"] = None, False, str(exc)
    if record is not None and record.checkpoint is not None:
        local["cosigned_size"] = int(record.checkpoint.split("\n")[1])
        local["walked"] = record.walked
    signing = signing_key_status(store)
    pinned = record.log_vkey if record is not None else None
    remote = (
        check_remote(store, timeout or STATUS_WITNESS_TIMEOUT_S, pinned)
        if signing["ok"] or pinned
        else []
    )
    return {"local_witness": local, "remote_witnesses": remote, "signing_key": signing}


def signing_key_status(store: EventStore) -> dict[str, Any]:
    """Where the signing key is read from, whether it is outside the profile, and whether
    it can be used (a lost key stops every checkpoint: docs/RECOVER.md)."""
    from archive_provider.storage.store_pieces import KeyFileError, read_signer, signing_key_path

    try:
        path = signing_key_path(store.path.parent)
    except KeyFileError as exc:  # the variable naming it comes from inside the profile
        return {"path": None, "outside_profile": False, "ok": False, "problem": str(exc)}
    data: dict[str, Any] = {
        "path": str(path),
        "outside_profile": not path.absolute().is_relative_to(store.path.parent.parent.absolute()),
    }
    try:
        data.update(ok=True, problem=None, vkey=read_signer(path, store.origin).vkey)
    except KeyFileError as exc:
        data.update(ok=False, problem=str(exc), vkey=None)
    return data


#: index rows of each kind (messages, memory) re-proved by status: the newest ones
RECALL_SAMPLE = 200


def recall_check(store: EventStore) -> dict[str, Any] | None:
    """Re-prove the newest recall index rows against the log, as prefetch does when serving."""
    from archive_provider.projections.recall import EXCERPT_CHARS, Hit, Prover

    conn = store.conn
    if not conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'recall_fts'").fetchone():
        return None
    columns = f"substr(text, 1, {EXCERPT_CHARS}), kind, session, seq, role"
    rows = [
        *conn.execute(
            f"SELECT {columns} FROM recall_fts WHERE rowid > 0 ORDER BY rowid DESC LIMIT ?",
            (RECALL_SAMPLE,),
        ),
        *conn.execute(
            f"SELECT {columns} FROM recall_fts WHERE rowid < 0 ORDER BY rowid LIMIT ?",
            (RECALL_SAMPLE,),
        ),
    ]
    from archive_provider.storage.store import reader_vkey

    prover = Prover(conn, reader_vkey(store.path.parent, conn))
    prover.proven([Hit(r[0], r[1], r[2], int(r[3]), r[4] or "", None, 0.0) for r in rows])
    return {
        "checked": len(rows),
        "withheld": len(prover.withheld),
        "first_problem": prover.withheld[0] if prover.withheld else None,
    }


def _refused_lines(data: dict[str, Any]) -> list[str]:
    """One line per protection variable refused because the profile sets it, or because it
    points inside the profile (docs/DESIGN.md, "Trust boundary")."""
    return [f"Protection: REFUSED: {problem}" for problem in data.get("refused_variables", ())]


def _spill_lines(spill: dict[str, Any]) -> list[str]:
    lines = []
    if spill["segments"]:
        lines.append(
            f"Spill: {spill['segments']} segment(s), {spill['bytes']:,} bytes of accepted events "
            "waiting; the provider takes them in when it next opens the archive"
        )
    if spill["damaged"]:
        lines.append(
            f"Damaged spill kept aside in spill/damaged: {', '.join(spill['damaged'])} "
            "(review with `hermes-archive spill show`; docs/RECOVER.md, 'Damaged spill')"
        )
    return lines


def _human(data: dict[str, Any]) -> str:
    from archive_provider.format.verifier import printable

    if not data["exists"]:
        return "\n".join(
            [
                f"No archive yet at {data['archive']} (it is created when the provider first runs).",
                *_refused_lines(data),
                *_spill_lines(data["spill"]),
            ]
        )
    last = data["last_event"]
    by_type = ", ".join(f"{k} {v}" for k, v in sorted(data["events_by_type"].items()))
    lines = [
        f"Archive: {data['archive']}",
        f"Store: {data['store_id']} (format {data['format_version']}, created {data['created']})",
        f"Events: {data['events']}" + (f" ({by_type})" if by_type else ""),
        f"Sessions: {data['sessions']}   Checkpoints: {data['checkpoints']}   "
        f"Size: {data['bytes']:,} bytes",
        f"Head: seq {data['head']['seq']} chain {data['head']['chain']}",
        *_refused_lines(data),
    ]
    if last:
        lines.append(
            f"Last event: seq {last['seq']} {last['type']} at {last['time']} "
            f"(session {printable(last['session'])})"
        )
    recall = data.get("recall")
    signing = data.get("signing_key")
    if recall and signing is not None and not signing["ok"]:
        lines.append("Recall: withheld (the signed tree cannot be checked without the key)")
    elif recall and recall["withheld"]:
        lines.append(
            f"Recall: {recall['withheld']} of the newest {recall['checked']} index rows do not "
            f"match the log ({recall['first_problem']}); prefetch and archive_search withhold "
            "them. Run `hermes-archive verify --projections`, then `hermes-archive replay`"
        )
    elif recall:
        lines.append(f"Recall: the newest {recall['checked']} index rows match the log")
    lines.extend(witness_lines(data))
    lines += _spill_lines(data["spill"])
    if data.get("last_unfinished_drain"):
        lines.append(drain_line(data["last_unfinished_drain"]))
    rebuild = [name for name, p in data["projections"].items() if p.get("rebuild")]
    stale = [n for n, p in data["projections"].items() if not p["current"] and n not in rebuild]
    if not data["projections"]:
        lines.append("Projections: none yet (they are created when the provider opens the archive)")
    elif rebuild:
        lines.append(
            "Projections: stored by an older release, rebuilt from the log at the provider's "
            f"next start (or by `hermes-archive replay`): {', '.join(rebuild)}"
            + (f"; behind: {', '.join(stale)}" if stale else "")
        )
    else:
        lines.append(
            "Projections: " + ("all current" if not stale else "behind: " + ", ".join(stale))
        )
    shipping = data.get("shipping")
    if shipping:
        from archive_provider.fleet.ship import describe_state

        lines.append("Shipping " + describe_state(shipping))
    required = data.get("shipping_required")
    if required:
        lines.append(
            f"Shipping required: {required['line']}" if required["met"] else required["line"]
        )
    return "\n".join(lines)


def witness_lines(data: dict[str, Any]) -> list[str]:
    """One line for the signing key, one for the local witness and one per remote witness
    (lag and last error)."""
    from archive_provider.format.verifier import printable

    lines = []
    signing = data.get("signing_key")
    if signing is not None and not signing["ok"]:
        lines.append(
            f"Signing key: UNUSABLE: {signing['problem']} Until it is back no checkpoint is "
            "signed and recall is withheld (docs/RECOVER.md, 'Lost or leaked signing key')"
        )
    elif signing is not None:
        where = "outside the profile" if signing["outside_profile"] else "inside the profile"
        lines.append(f"Signing key: {signing['path']} ({where})")
    local = data.get("local_witness")
    if local is not None:
        if not local["ok"]:
            lines.append(f"Witness: REFUSED: {local['problem']}")
        elif "cosigned_size" in local:
            walked = local.get("walked") or {}
            walk = (
                "older history walked"
                if walked.get("complete")
                else f"background walk at seq {walked.get('size', 0)}"
            )
            lines.append(f"Witness: cosigned size {local['cosigned_size']} ({walk})")
        else:
            lines.append("Witness: no cosigned checkpoint yet")
    for row in data.get("remote_witnesses", ()):
        name = printable(row["name"])
        if row.get("consistent") is False:
            lines.append(f"Remote witness {name}: REFUSES this archive: {row['error']}")
        elif row.get("error"):
            cosigned = row["cosigned_size"]
            lines.append(
                f"Remote witness {name}: behind by {row['behind']} "
                + ("(nothing cosigned yet)" if cosigned is None else f"(cosigned size {cosigned})")
                + f"; last error: {printable(row['error'])}"
            )
        else:
            lines.append(
                f"Remote witness {name}: cosigned size {row['witness_size']} of {row['head']} "
                f"(behind by {row['behind']})"
            )
    return lines


def run(ctx: CommandContext) -> int:
    """0; 1 without an archive (nothing found, as for every command) or when the witness
    refuses it (the provider and every command that writes refuse it too); 3 when shipping
    is required by setting and is behind its bound or cannot run (docs/AUDIT.md)."""
    from archive_provider.host.shipping import EXIT_SHIPPING_BEHIND

    data = collect(ctx)
    ctx.emit(data, _human)
    if not data["exists"] or not data.get("local_witness", {"ok": True})["ok"]:
        return 1
    required = data.get("shipping_required")
    return EXIT_SHIPPING_BEHIND if required and not required["met"] else 0
