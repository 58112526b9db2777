"""spill: review the spill segments kept aside; take in deliberately one nothing authenticates.

A writer without a usable witness folder cannot key its spill records (docs/FORMAT.md,
"Spill file"), so the next open sets its segment aside in ``spill/damaged/`` and archives
nothing of it: anyone who can write the profile could have written such a segment.
``spill show`` lists what is kept there and, for one FILE, its records; ``spill accept FILE
--reason WHY --yes`` records who accepted them and why (a ``spill_accepted`` event, with the
file's digest), then takes the records in after it, as the next open takes in its spill.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

from archive_provider.commands import CommandContext, CommandError, UsageError

if TYPE_CHECKING:
    from archive_provider.storage.spill import Record

NAME = "spill"
HELP = "show spill segments kept aside; accept one that nothing authenticates into the log"
#: how much of a record's arguments ``show FILE`` prints
PREVIEW_CHARS = 160


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=("show", "accept"), help="show, or accept FILE")
    parser.add_argument("file", nargs="?", help="a file in archive/spill/damaged/ (its name)")
    parser.add_argument("--reason", help="accept: why (required: recorded in the log)")
    parser.add_argument(
        "--yes",
        action="store_true",
        help="accept: you reviewed the records (`spill show FILE`): nothing authenticates them",
    )


def _read(path: Path, key: bytes | None) -> tuple[list[Record], str, str | None]:
    """The records of a kept segment up to the first that does not check, what they check
    with (the spill key, or nothing: an unkeyed check anyone can compute), and why reading
    stopped (None: at the end)."""
    from archive_provider.storage.spill import SpillDamaged, read_records

    stop = None
    for checked_with, with_key in [*([("the spill key", key)] if key else []), ("nothing", None)]:
        records: list[Record] = []
        try:
            records.extend(read_records(path, key=with_key))
        except SpillDamaged as exc:
            if records:
                return records, checked_with, exc.reason
            stop = stop or exc.reason
            continue
        return records, checked_with, None
    return [], "nothing readable", stop


def _segment_id(path: Path) -> str:
    from archive_provider.storage.spill import HEADER_BYTES, MAGIC, open_segment

    with open_segment(path) as handle:
        header = handle.read(HEADER_BYTES)
    return header[len(MAGIC) :].hex() if header.startswith(MAGIC) else ""


def _describe(ctx: CommandContext, path: Path, key: bytes | None) -> dict[str, Any]:
    records, checked_with, stop = _read(path, key)
    sessions = sorted({str(r.args.get("session", "")) for r in records} - {""})
    segment = _segment_id(path)
    return {
        "file": path.name,
        "segment": segment,
        "checked_with": checked_with,
        "records": len(records),
        "kinds": dict(Counter(r.kind for r in records)),
        "sessions": sessions,
        "first_accepted": records[0].accepted if records else None,
        "last_accepted": records[-1].accepted if records else None,
        "stops_because": stop,
        "accepted_at_seq": _accepted_seq(ctx, segment),
    }


def _accepted_seq(ctx: CommandContext, segment: str) -> int | None:
    """The seq of this segment's ``spill_accepted``, if an operator accepted it already."""
    from archive_provider.domain import builders
    from archive_provider.storage.writer import logged_seq

    if not segment or not ctx.exists():
        return None
    event = builders.spill_accepted(segment, file="", digest="", kinds={}, reason="", who={})
    with ctx.store() as store:
        return logged_seq(store, event)


def _kept(ctx: CommandContext, name: str) -> Path:
    from archive_provider.storage.spill import damaged_paths

    for path in damaged_paths(ctx.archive):
        if path.name == name:
            return path
    raise CommandError(f"{name} is not kept in {ctx.archive / 'spill' / 'damaged'}")


def _show(ctx: CommandContext, key: bytes | None) -> dict[str, Any]:
    from archive_provider.storage.spill import damaged_paths

    if ctx.args.file is None:
        return {"ok": True, "kept": [_describe(ctx, p, key) for p in damaged_paths(ctx.archive)]}
    path = _kept(ctx, ctx.args.file)
    records = _read(path, key)[0]
    return {
        "ok": True,
        "kept": [_describe(ctx, path, key)],
        "records": [
            {
                "kind": r.kind,
                "session": r.args.get("session"),
                "accepted": r.accepted,
                "args": json.dumps(r.args, ensure_ascii=False)[:PREVIEW_CHARS],
            }
            for r in records
        ],
    }


def _human_show(data: dict[str, Any]) -> str:
    if not data["kept"]:
        return "No spill segment is kept aside."
    lines = []
    for kept in data["kept"]:
        kinds = ", ".join(f"{n} {kind}" for kind, n in sorted(kept["kinds"].items()))
        lines.append(
            f"{kept['file']}: {kept['records']} records checked with {kept['checked_with']}"
            + (f" ({kinds})" if kinds else "")
            + (f"; stops: {kept['stops_because']}" if kept["stops_because"] else "")
        )
        if kept["accepted_at_seq"] is not None:
            lines.append(f"  accepted into the log at seq {kept['accepted_at_seq']}")
        elif kept["checked_with"] == "nothing" and kept["records"]:
            lines.append(
                "  nothing authenticates these records (a writer without a usable witness "
                "folder, or anyone who can write the profile); review them with "
                f"`spill show {kept['file']}` before `spill accept`"
            )
    for n, record in enumerate(data.get("records", ()), 1):
        lines.append(
            f"  {n}. {record['accepted']} {record['kind']} "
            f"session={record['session']}: {record['args']}"
        )
    return "\n".join(lines)


def _accept(ctx: CommandContext, key: bytes, reason: str) -> dict[str, Any]:
    from blake3 import blake3

    from archive_provider.domain import builders
    from archive_provider.host.spill_kinds import take_in_spill
    from archive_provider.storage.spill import in_use, segment_paths, write_accepted
    from archive_provider.storage.witness import who

    path = _kept(ctx, ctx.args.file)
    records, checked_with, _ = _read(path, key)
    if checked_with != "nothing" or not records:
        raise CommandError(
            f"{path.name} holds no records that only lack authentication ({checked_with}): "
            "records that check with the spill key were taken in when it was set aside, "
            "up to its damage (docs/RECOVER.md, 'Damaged spill')"
        )
    live = [p.name for p in segment_paths(ctx.archive) if in_use(p)]
    if live:
        raise CommandError(
            f"a running Hermes process is writing the spill ({', '.join(live)}): stop it first"
        )
    segment = _segment_id(path)
    kinds = Counter(r.kind for r in records)
    event = builders.spill_accepted(
        segment,
        file=path.name,
        digest=blake3(path.read_bytes()).hexdigest(),
        kinds=kinds,
        reason=reason,
        who=who(),
    )
    store = ctx.open_writable()
    try:
        (result,) = store.append([event], durable=True)
    finally:
        store.close()
    before = _event_count(ctx)
    write_accepted(ctx.archive, bytes.fromhex(segment), records, key)
    take_in_spill(ctx.home)
    return {
        "ok": True,
        "event_seq": result.seq,
        "outcome": result.outcome,
        "records": len(records),
        "events_added": _event_count(ctx) - before,
    }


def _event_count(ctx: CommandContext) -> int:
    with ctx.store() as store:
        return store.head().seq


def run(ctx: CommandContext) -> int:
    from archive_provider.storage.checkpoint_proof import spill_key
    from archive_provider.storage.witness import Witness

    key = spill_key(Witness.for_home(ctx.home))
    if ctx.args.action == "show":
        data = _show(ctx, key)
        ctx.emit(data, _human_show)
        return 0
    if ctx.args.file is None:
        raise UsageError("spill accept needs FILE (a name `spill show` lists)")
    reason = (ctx.args.reason or "").strip()
    if not reason:
        raise UsageError('spill accept needs --reason "why these records are yours"')
    if not ctx.args.yes:
        raise UsageError(
            "nothing authenticates these records: review them with `spill show FILE`, then "
            "say so with --yes"
        )
    if key is None:
        raise CommandError(
            "the witness folder cannot key the spill now; fix it first (docs/RECOVER.md)"
        )
    data = _accept(ctx, key, reason)
    ctx.emit(
        data,
        lambda d: (
            f"accepted: spill_accepted at seq {d['event_seq']}"
            + (" (already recorded)" if d["outcome"] == "already_archived" else "")
            + f"; {d['records']} records taken in, {d['events_added']} events added"
        ),
    )
    return 0
