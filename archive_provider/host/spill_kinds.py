"""What each provider hook's job is as a spill record, and how a record is taken back in.

The writer spills a job it cannot hold in memory (or journals every one, with
``journal_every_event``) as a record of plain data: the hook's kind and arguments
(:mod:`archive_provider.storage.spill`). The provider and :class:`~archive_provider.host.
core.ArchiveCore` hand every job its record encoder (:func:`spill_entry`, :func:`turn_entry`);
:func:`spill_kinds` turns a record back into the job's events on the next open.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ..domain import builders
from ..domain.echoes import cut_echoes
from ..domain.evidence import archivable, archivable_message, new_messages_start
from ..domain.redaction import redact_rows, renumber
from ..errors import ArchiveUnavailable
from ..format.events import NewEvent
from ..projections.builtin import (
    live_counters,
    pending_rewind,
    settled,
    transcript_rows,
    transcript_tail,
)
from ..projections.recall import FENCE_OPEN, recall_echo_cut
from ..projections.registry import default_projections
from ..storage.spill import Encoder, Record, in_use, segment_paths
from ..storage.store import EventStore, archive_dir
from ..storage.store_pieces import served_results
from ..storage.witness import Witness
from ..storage.writer import Taker, Writer, WriterUnavailable
from .settings import load_settings


def text_size(value: Any) -> int:
    """Characters of a hook argument when it is text (a cheap estimate of what it holds)."""
    return len(value) if isinstance(value, str) else 256


def turn_event(
    store: EventStore,
    session: str,
    turns: int,
    rows: list[Any],
    start: int | None,
    legacy: bool,
    redact: bool,
    author: Mapping[str, Any] | None = None,
    detected_by: str = "sync_turn",
) -> tuple[list[NewEvent], str | None]:
    """The events of a turn (runs on the writer thread), and the digest of its last message.

    With ``start`` known (the caller proved messages before it are archived as they are),
    ``rows`` is only the tail from ``start`` and only it is redacted and hashed. Otherwise
    ``rows`` is the whole transcript and the new messages are found against the transcript
    projection (a legacy turn is all new); after a rewind (``/undo``) the archived messages
    past the common prefix are first recorded as ``turns_rewound`` (docs/HOST.md §2.3).
    The direct hook and a take-in from the spill both build here, so they make the same
    events: the author as the host stated it and the host's masks included.
    """
    redacted, redactions, row_masks = redact_rows(rows, redact, "/messages")
    # the recalls it echoes, by reference (FORMAT.md 13.4)
    redacted, echoes = cut_echoes(redacted, served_results(store.conn, session), FENCE_OPEN)
    rewind: list[NewEvent] = []
    known_start = start is not None  # ``rows`` is then only the new tail
    if start is not None:
        new_parts = [store.hasher.part(row) for row in redacted]
        found = renumber(redactions, 0, "/messages")  # the tail is the event's own list
        masks = renumber(row_masks, 0, "/messages")
        last = new_parts[-1].digest if new_parts else None
    else:
        parts = [store.hasher.part(row) for row in redacted]
        if legacy:
            start = 0
        else:
            archived = transcript_rows(settled(store), session)
            previous = [digest for digest, _ in archived]
            current = [p.digest for p in parts]
            roles = [r.get("role") for r in redacted]
            start = new_messages_start(previous, current, roles)
            switch = pending_rewind(store.conn, session)
            if switch is not None:
                common = _common_prefix(previous, current)
                if common < len(previous):
                    rewind = [
                        builders.turns_rewound(
                            session,
                            switch_seq=switch,
                            start=common,
                            rewound=[(seq, d) for d, seq in archived[common:]],
                            detected_by=detected_by,
                        )
                    ]
                    start = common
        new_parts = parts[start:]
        found = renumber(redactions, start, "/messages")
        masks = renumber(row_masks, start, "/messages")
        last = parts[-1].digest if parts else None
    if not new_parts:
        return rewind, last  # nothing new: the host re-sent what is archived
    first = 0 if known_start else start  # the index in ``redacted`` of the first new message
    event = builders.turn(
        store.hasher,
        session,
        turns + 1,
        new_parts,
        start=start,
        legacy=legacy,
        redactions=found,
        author=author,
        host_masks=masks,
        echoes=[
            {**echo, "message": echo["message"] - first}
            for echo in echoes
            if echo["message"] >= first
        ],
    )
    return [*rewind, event], last


def _common_prefix(previous: Sequence[str], current: Sequence[str]) -> int:
    """How many leading digests two transcripts share."""
    count = 0
    for old, new in zip(previous, current, strict=False):
        if old != new:
            break
        count += 1
    return count


def turn_entry(
    session: str,
    snapshot: list[Any],
    legacy: bool,
    redact: bool,
    author: Mapping[str, Any] | None = None,
) -> Encoder:
    """A turn as a spill record: only what is new since the session's last record in the
    same segment (``base`` messages are that record's), so a re-sent transcript costs its
    tail, not its length. The author (domain/authors.py) travels with it, as the host
    stated it.

    The prefix is recognised by the identity of the messages: the host re-sends the very
    objects, and a rewritten transcript (compression, rewind) holds new ones. A sample of
    positions is compared (at most :data:`PREFIX_PROBES`), so a shutdown with 100k queued
    turns of long transcripts stays linear; the rows are written as sent and made
    archivable when taken in.
    """

    def encode(state: dict[Any, Any]) -> tuple[str, dict[str, Any]]:
        base = 0
        seen = None if legacy else state.get(("turn", session))
        if seen is not None and _same_prefix(seen, snapshot):
            base = len(seen)
        if not legacy:
            state[("turn", session)] = snapshot
        args = {
            "session": session,
            "base": base,
            "rows": snapshot[base:],
            "legacy": legacy,
            "redact": redact,
            "author": None if author is None else dict(author),
        }
        return "turn", args

    return encode


PREFIX_PROBES = 64


def _same_prefix(seen: Sequence[Any], snapshot: Sequence[Any]) -> bool:
    count = len(seen)
    if count > len(snapshot):
        return False
    step = max(1, count // PREFIX_PROBES)
    probes = [*range(0, count, step), count - 1] if count else []
    return all(seen[i] is snapshot[i] for i in probes)


@dataclass
class _Taken:
    """A session's transcript as the spill segment being taken in has rebuilt it."""

    rows: list[Any]
    last: str | None  # the digest of its last message, when this take-in hashed it


def _take_turn(
    store: EventStore | None,
    record: Record,
    state: dict[Any, Any],
    detected_by: str = "sync_turn",
) -> Sequence[NewEvent]:
    """A spilled turn's events: the fast path when the log ends where the last record of this
    session left it, else the full path (which also makes a second take-in add nothing and
    finds a rewind, as the direct hook does)."""
    args = record.args
    session, base = str(args["session"]), int(args["base"])
    tail = [archivable_message(m) for m in args["rows"]]
    legacy, redact = bool(args["legacy"]), bool(args["redact"])
    author = args.get("author")  # a record of an older spill has none
    author = author if isinstance(author, Mapping) else None
    events: list[NewEvent] = []
    if legacy:
        if store is not None:
            turns = live_counters(store, session)[0]
            events, _ = turn_event(store, session, turns, tail, None, True, redact, author)
        return events
    known = state.get(session)
    if base and (known is None or base > len(known.rows)):
        raise ValueError(f"the record builds on {base} messages the segment does not hold")
    rows = (known.rows[:base] if base and known is not None else []) + tail
    last = None
    if store is not None:
        turns = live_counters(store, session)[0]
        fast = (
            known is not None
            and base == len(known.rows) > 0
            and known.last is not None
            and transcript_tail(store, session) == (base - 1, known.last)
        )
        if fast:
            events, last = turn_event(store, session, turns, tail, base, False, redact, author)
            last = last or (known.last if known is not None else None)
        else:
            events, last = turn_event(
                store, session, turns, rows, None, False, redact, author, detected_by
            )
    state[session] = _Taken(rows, last)
    return events


def _plain(
    build: Callable[[EventStore, dict[str, Any]], NewEvent],
) -> Taker:
    """A taker for a record whose event depends on its arguments (and the store) only."""

    def take(store: EventStore | None, record: Record, state: dict[Any, Any]) -> Sequence[NewEvent]:
        return [] if store is None else [build(store, record.args)]

    return take


def _take_session_end(
    store: EventStore | None, record: Record, state: dict[Any, Any]
) -> Sequence[NewEvent]:
    args = record.args
    events = list(_take_turn(store, record, state, "session_end")) if args.get("rows") else []
    if store is None:
        return []
    ended = builders.session_ended(
        str(args["session"]), at=str(args["at"]), message_count=int(args["message_count"])
    )
    return [*events, ended]


def _take_memory_write(store: EventStore, a: dict[str, Any]) -> NewEvent:
    session = str(a["session"])
    _, writes = live_counters(store, session)
    return builders.memory_write(
        store.hasher,
        session,
        writes + 1,
        a["action"],
        a["target"],
        a["content"],
        a["meta"],
        redact=bool(a["redact"]),
    )


#: how the record of each simple hook becomes its event: the hook builds with it directly and a
#: take-in from the spill builds with it again, so both make the same event
RECORD_BUILDERS: dict[str, Callable[[EventStore, dict[str, Any]], NewEvent]] = {
    "session_started": lambda store, a: builders.session_started(
        a["session"], at=a["at"], details=a["details"], redact=a["redact"]
    ),
    "session_switched": lambda store, a: builders.session_switched(
        a["session"],
        previous=a["previous"],
        at=a["at"],
        details=a["details"],
        redact=a["redact"],
    ),
    "memory_write": _take_memory_write,
    "delegation": lambda store, a: builders.delegation(
        store.hasher,
        a["session"],
        task=a["task"],
        result=a["result"],
        child_session=a["child_session"],
        details=a["details"],
        redact=a["redact"],
        cut=recall_echo_cut(store, a["session"]),
    ),
    "tool_call": lambda store, a: builders.tool_call(
        store.hasher,
        a["session"],
        at=a["at"],
        tool=a["tool"],
        args=a["args"],
        result=a["result"],
        details=a["details"],
        redact=a["redact"],
    ),
    "checkpoint_failed": lambda store, a: builders.checkpoint_failed(
        a["session"],
        at=a["at"],
        error=a["error"],
        require_checkpoint=a["require_checkpoint"],
        evidence_count=a["evidence_count"],
        redact=a["redact"],
    ),
    "recall_served": lambda store, a: builders.recall_served(
        store.hasher,
        a["session"],
        turn=a["turn"],
        query=a["query"],
        result=a["result"],
        sources=a["sources"],
        at=a["at"],
        redact=a["redact"],
    ),
    "write_failed": lambda store, a: builders.write_failed(
        a["session"], at=a["at"], hook=a["hook"], error=a["error"]
    ),
}

#: every kind of spill record the provider writes, and how it is taken in
_TAKERS: dict[str, Taker] = {
    "turn": _take_turn,
    "session_ended": _take_session_end,
    **{kind: _plain(build) for kind, build in RECORD_BUILDERS.items()},
}


def spill_kinds(redact_secrets: bool) -> dict[str, Taker]:
    """How each kind of record is taken in under the current ``redact_secrets``: a record
    may ask for redaction, never switch it off (what it says was written where the profile
    can write; the setting is the archive's now)."""
    if not redact_secrets:
        return dict(_TAKERS)

    def redacting(take: Taker) -> Taker:
        def taken(
            store: EventStore | None, record: Record, state: dict[Any, Any]
        ) -> Sequence[NewEvent]:
            return take(store, replace(record, args={**record.args, "redact": True}), state)

        return taken

    return {kind: redacting(take) for kind, take in _TAKERS.items()}


def spill_entry(kind: str, **args: Any) -> Encoder:
    """A record whose arguments are taken as they are now (made encodable, nothing lost)."""
    return lambda state: (kind, archivable(args))


class SpillNotTakenIn(ArchiveUnavailable):
    """The pending spill could not be taken in (a live process holds it, or the log refused)."""


def take_in_spill(home: Path, *, timeout: float = 900.0) -> int:
    """Take the profile's pending spill into its log, as the provider's next open would, and
    return how many segments were waiting (0: nothing to do, no writer started).

    ``forget`` and ``migrate`` run this first, so the spill's events are in the log they
    erase from or migrate, and no segment keeps erased text or outlives its format. A
    segment a running Hermes process still appends to is refused (:func:`in_use`): that
    process takes it in, possibly after the command ran. The writer proves the log first
    (with the profile's witness) and is closed before this returns, so the command's own
    connection never waits on it.
    """
    folder = archive_dir(home)
    waiting = segment_paths(folder)
    if not waiting:
        return 0
    live = [p.name for p in waiting if in_use(p)]
    if live:
        raise SpillNotTakenIn(
            f"a running Hermes process is still writing the spill ({', '.join(live)}) of "
            f"{folder}: stop Hermes (its shutdown writes the spill and lets go of it) and run "
            "this again"
        )
    writer = Writer(
        folder,
        projections_factory=default_projections,
        witness=Witness.for_home(home),
        kinds=spill_kinds(load_settings(home).redact_secrets),
    )
    try:  # behind the spill's records: returns once they are committed (FULL), or raises
        writer.append_durable(lambda store: (), timeout=timeout, label="take in the spill")
    except WriterUnavailable:
        pass  # refused or too slow: said below, with what is left
    finally:
        writer.close()
    left = [p.name for p in segment_paths(folder) if p in waiting]
    if writer.refused is not None or left:
        raise SpillNotTakenIn(
            f"the spill of {folder} was not taken in ({', '.join(left) or 'none left'}): "
            f"{writer.refused or writer.last_error or 'it took longer than ' + str(timeout) + 's'}"
        )
    return len(waiting)
