"""show: one event in full: envelope, chain value, decoded payload and every part it names."""

from __future__ import annotations

import argparse
import json
import re
from typing import TYPE_CHECKING, Any

from archive_provider.commands import CommandContext, UsageError
from archive_provider.commands._render import envelope_record, record
from archive_provider.domain.authors import author_label

if TYPE_CHECKING:
    from archive_provider.storage.store import EventStore

NAME = "show"
HELP = (
    "show an event by sequence number or identity/payload digest prefix, payload and parts decoded"
)
_PREFIX = re.compile(r"[0-9a-f]{4,64}")


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "event",
        metavar="SEQ|DIGEST",
        help="a sequence number, or at least 4 leading hex digits of an identity or payload digest",
    )


def find(store: EventStore, ref: str) -> list[int]:
    """The seqs of the events named by ``ref``: a seq, or a digest prefix matching exactly one
    digest value (an event whose body was erased is named too: its envelope stays).

    A number is a seq when that event exists; otherwise, from four digits on, it is read as a
    digest prefix, since about one digest in forty starts with eight decimal digits.

    An identity names one event; a payload digest may be shared by several events with the
    same payload (it is stored once), and then all of them are shown.
    """
    if ref.isdigit() and len(ref) <= 18:
        found = store.conn.execute("SELECT seq FROM events WHERE seq = ?", (int(ref),)).fetchone()
        if found is not None or len(ref) < 4:
            return [int(found[0])] if found else []
    prefix = ref.lower()
    if not _PREFIX.fullmatch(prefix):
        raise UsageError(
            f"{ref!r} is neither a sequence number nor a hex digest prefix (4 to 64 digits)"
        )
    # 32-byte BLOBs: every digest with the prefix lies within
    bounds = (bytes.fromhex(prefix.ljust(64, "0")), bytes.fromhex(prefix.ljust(64, "f")))
    conn = store.conn
    digests: dict[tuple[str, str], list[int]] = {}
    for kind in ("identity", "payload"):
        rows = conn.execute(
            f"SELECT {kind}, seq FROM events WHERE {kind} >= ? AND {kind} <= ? ORDER BY seq",
            bounds,
        ).fetchall()
        for digest, seq in rows:
            text = digest.hex() if isinstance(digest, bytes) else str(digest)
            if text.startswith(prefix):
                digests.setdefault((kind, text), []).append(seq)
    if len(digests) > 1:
        shown = "; ".join(
            f"{kind} {digest[:16]}… (seq {', '.join(map(str, seqs[:5]))})"
            for (kind, digest), seqs in list(digests.items())[:6]
        )
        raise UsageError(f"{ref!r} matches {len(digests)} digests: {shown}; give more digits")
    return next(iter(digests.values()), [])


def _human(data: dict[str, Any]) -> str:
    from archive_provider.format.verifier import printable

    blocks = []
    for e in data["events"]:
        lines = [
            f"seq {e['seq']}  {e['type']}  {e['time']}  session {printable(e['session'])}",
            f"  identity  {e['identity']}",
            f"  payload   {e['payload_digest']}",
            f"  chain     {e['chain']}",
            f"  key       {json.dumps(e['key'], ensure_ascii=False, sort_keys=True)}",
            f"  summary   {e['summary']}",
            *([f"  author    {author_label(e['author'])}"] if "author" in e else []),
            "payload:",
            *(
                [f"  ({e['erased']})"]  # its body erased: the envelope is all there is
                if e.get("erased")
                else (
                    "  " + line
                    for line in json.dumps(
                        e["payload"], indent=2, ensure_ascii=False, sort_keys=True
                    ).splitlines()
                )
            ),
        ]
        if e["parts"]:
            lines.append(f"parts ({len(e['parts'])}):")
            for p in e["parts"]:
                value = (
                    f"({p['erased']})"
                    if p.get("erased")
                    else "(missing from the archive)"
                    if p["value"] is None
                    else json.dumps(p["value"], ensure_ascii=False, sort_keys=True)
                )
                lines.append(f"  {p['digest'][:16]}…  {value}")
                if "as_sent" in p:  # recall echoes filled in (FORMAT.md 13.4)
                    sent = json.dumps(p["as_sent"], ensure_ascii=False, sort_keys=True)
                    lines.append(f"    as sent, with the recall it echoes: {sent}")
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)


def run(ctx: CommandContext) -> int:
    with ctx.store() as store:
        events = [
            record(store, event, full=True)
            if (event := store.event(seq)) is not None
            else envelope_record(store, seq, full=True)
            for seq in find(store, ctx.args.event)
        ]
        data = {"query": ctx.args.event, "events": events}
    if not events:
        return ctx.fail(f"no event matches {ctx.args.event!r}")
    ctx.emit(data, _human)
    return 0
