"""One line per event, as people read it: the one summariser behind ``log``, ``show`` and
the audit report, so the same event reads the same wherever it is shown.

An erased part reads as its slot, "(erased at T by seq E: reason)"; an event whose body an
erasure removed reads as such (:func:`envelope_summary`); a text that echoed a served recall is
summarised as archived (the echo cut out) and marked with the recall it echoed.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Protocol

from archive_provider.domain.authors import author_label
from archive_provider.domain.evidence import message_text
from archive_provider.format.canonical import decode
from archive_provider.format.events import StoredEvent


class Archive(Protocol):
    """What a summary reads from an archive: payload bodies by digest (local or central)."""

    def payload(self, digest: str) -> bytes | None: ...


def cut(text: str, width: int) -> str:
    """``text`` as it is, only cut at ``width`` characters (the last one an ellipsis)."""
    return text if len(text) <= width else text[: width - 1] + "…"


def one_line(value: Any, width: int) -> str:
    """Text (or a value's JSON) on one line, at most ``width`` characters."""
    text = (
        value
        if isinstance(value, str)
        else json.dumps(value, ensure_ascii=False, sort_keys=True, default=str)
    )
    return cut(" ".join(text.split()), width)


def count(n: Any, noun: str) -> str:
    """``n noun``, the noun plural unless ``n`` is 1 ("1 source", "2 sources")."""
    return f"{n} {noun}" + ("" if n == 1 else "s")


def preview(value: Any, width: int = 60) -> str:
    """A one-line quoted preview of text (or of a value's JSON)."""
    return json.dumps(one_line(value, width), ensure_ascii=False)


def fields(body: Mapping[str, Any], width: int | None = None) -> str:
    """``name=value`` for each field, values as plain text (nested values as compact JSON),
    cut to ``width`` characters if given: how people read a scope, a selector or a body."""
    text = " ".join(
        f"{name}={value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)}"
        for name, value in body.items()
    )
    return text if width is None else cut(text, width)


def part(store: Archive, digest: Any, event: StoredEvent | None = None) -> Any:
    """A part's decoded value; an erased slot's "(erased at T by seq E: reason)"; else None.

    The body is taken from ``event``'s carried parts when it has them (a streamed event),
    else read from ``store``. Erasures are read from a local archive; a central one blanks
    erased bodies itself.
    """
    carried = getattr(event, "parts", None)
    body = carried.get(digest) if isinstance(carried, Mapping) else None
    if body is None:
        body = store.payload(digest) if isinstance(digest, str) else None
    if body is None:
        slot = erased(store, digest)
        return f"({slot})" if slot else None
    return decode(body)


def erased(store: Archive, digest: Any) -> str | None:
    """The erased slot of a digest in a local archive (a central one has no erasure rows)."""
    from archive_provider.audit.erasure import erased_slot
    from archive_provider.storage.store import EventStore

    if isinstance(store, EventStore) and isinstance(digest, str):
        return erased_slot(store.conn, digest)
    return None


def author_text(store: Archive, event: StoredEvent) -> str:
    """A turn's author as people read it; ``(erased)`` when an erasure took it."""
    digest = event.author_digest
    if not digest:
        return author_label(None)
    value = part(store, digest, event)
    return (
        "(erased)"
        if isinstance(value, str) and value.startswith("(erased")
        else (author_label(value))
    )


def envelope_summary(store: Archive, event_type: str, payload_digest: str) -> str:
    """The line of an event whose body is not in the archive (only its envelope is): an
    erasure removed it, or it is missing."""
    gone = "was erased" if erased(store, payload_digest) else "is missing from the archive"
    return f"{event_type.replace('_', ' ')}: its body {gone}"


def summary(store: Archive, event: StoredEvent, *, author: str | None = None) -> str:
    """What happened, in one line (the payload and the parts it names, briefly); the
    recalls its texts echoed; and where the host had already masked what it handed over
    (why the text differs from its own). ``author``: a turn's :func:`author_text`, when the
    caller has it already."""
    line = _what(store, event, author)
    body = event.body if isinstance(event.body, Mapping) else {}
    echoes = body.get("echoes")
    if isinstance(echoes, list) and echoes:
        seqs = sorted({e.get("recall") for e in echoes if isinstance(e, Mapping)}, key=str)
        line += f" [echoes recall seq {', '.join(map(str, seqs))}]"
    masks = body.get("host_masks")
    if isinstance(masks, list) and masks:
        kinds: dict[str, int] = {}
        for mask in masks:
            kind = str(mask.get("kind")) if isinstance(mask, Mapping) else "?"
            kinds[kind] = kinds.get(kind, 0) + 1
        line += " [host masked: " + ", ".join(f"{k} x{n}" for k, n in kinds.items()) + "]"
    return " ".join(line.split())  # one line, whatever the texts in it hold


def _message(value: Any) -> str:
    if not isinstance(value, Mapping):
        return preview(value, 50)
    text = message_text(value)
    if not text and value.get("tool_calls"):
        return "(tool calls)"
    return f"{value.get('role', '?')}: {preview(text, 50)}"


def _rewound(store: Archive, seq: int) -> int | None:
    """The rewind that took turn ``seq``'s messages out (local: a central store keeps no
    projections, so its turns show no marker)."""
    from archive_provider.projections.builtin import rewound_at
    from archive_provider.storage.store import EventStore

    return rewound_at(store.conn, seq) if isinstance(store, EventStore) else None


def _lead(store: Archive, event: StoredEvent, digests: list[str]) -> str:
    """A turn's lead message: its first user message; where none is left, an erased one's
    slot (not the system prompt); else its first. Read only as far as needed: a summary of
    every turn (the report's) decodes one message of most."""
    first: Any = None
    gone: Any = None
    for index, digest in enumerate(digests):
        value = part(store, digest, event)
        if isinstance(value, Mapping) and value.get("role") == "user":
            return _message(value)
        first = value if index == 0 else first
        gone = value if gone is None and not isinstance(value, Mapping) else gone
    return _message(gone if gone is not None else first) if digests else "no messages"


def _what(store: Archive, event: StoredEvent, author: str | None) -> str:
    body, kind = event.body, event.type
    if not isinstance(body, Mapping):
        return preview(body)
    if kind == "turn":
        digests = event.messages
        by = author if author is not None else author_text(store, event)
        rewound = _rewound(store, event.seq)
        return f"turn {body.get('turn')} by {by}: {count(len(digests), 'message')}; " + (
            _lead(store, event, digests) + (f" [rewound at seq {rewound}]" if rewound else "")
        )
    if kind == "memory_write":
        content = part(store, body.get("content"), event)
        given = body.get("metadata")
        metadata: Mapping[str, Any] = given if isinstance(given, Mapping) else {}
        if not content and metadata.get("old_text"):
            matching = preview(metadata["old_text"])
            return f"{body.get('action')} {body.get('target')}: matching {matching}"
        return f"{body.get('action')} {body.get('target')}: {preview(content)}"
    if kind == "checkpoint":
        return (
            f"{count(len(body.get('evidence', [])), 'message')} of evidence "
            f"(evidence digest {str(body.get('evidence_digest'))[:16]})"
        )
    if kind in ("checkpoint_failed", "write_failed"):
        what = "checkpoint failed" if kind == "checkpoint_failed" else body.get("hook")
        return f"{what}: {preview(body.get('error', ''), 80)}"
    if kind == "recall_served":
        return (
            f"turn {body.get('turn')}: query "
            f"{preview(part(store, body.get('query'), event), 40)}, "
            f"{count(len(body.get('sources', [])), 'source')}"
        )
    if kind == "session_started":
        details = {
            k: body[k] for k in ("platform", "agent_context", "parent_session_id") if body.get(k)
        }
        return " ".join(f"{k}={v}" for k, v in details.items()) or "started"
    if kind == "session_switched":
        flags = [name for name in ("reset", "rewound") if body.get(name)]
        reason = f" ({body['reason']})" if body.get("reason") else ""
        came = body.get("from")  # the host may keep the id (a compression in place)
        where = "same session id kept" if came and came == event.session else f"from {came or '?'}"
        return where + reason + (f" [{', '.join(flags)}]" if flags else "")
    if kind == "session_ended":
        return f"{count(body.get('message_count'), 'message')} at the end"
    if kind == "turns_rewound":
        return (
            f"{count(len(body.get('messages', [])), 'message')} rewound (positions "
            f"{body.get('from_message')}..{body.get('to_message')}) after switch seq "
            f"{body.get('switch_seq')}, seen at {body.get('detected_by')}"
        )
    if kind == "delegation":
        task = preview(part(store, body.get("task"), event), 50)
        return f"child {body.get('child_session') or '?'}: task {task}"
    if kind == "tool_call":
        args = preview(part(store, body.get("args"), event), 50)
        return f"{body.get('tool')} {body.get('status') or ''}: {args}"
    if kind == "shutdown_drain":
        return (
            f"shutdown drain unfinished after {body.get('timeout_s')} s: "
            f"{body.get('pending')} queued, {body.get('spilled')} spilled, "
            f"{body.get('unwritten')} lost"
        )
    if kind == "store_created":
        return f"archive created: store {body.get('store_id')}, format {body.get('format_version')}"
    if kind == "witness_accepted":
        head = body.get("accepted_head")
        at = f"head seq {head.get('seq')}" if isinstance(head, Mapping) else "the head"
        return f"witness accepted {at}: {body.get('reason')}"
    return _record(kind, body) or fields(body, 80)


def _record(kind: str, body: Mapping[str, Any]) -> str | None:
    """The line of a record event (an erasure, a hold, a retention policy, a witness
    change): what it did and why, never what it erased."""
    if kind == "erasure":
        given = body.get("scope")
        scope: Mapping[str, Any] = given if isinstance(given, Mapping) else {}
        basis = body.get("legal_basis")
        return (
            f"erasure ({scope.get('kind', '?')}): {count(body.get('payloads'), 'payload')}, "
            f"{count(body.get('events'), 'event')}; reason {body.get('reason')!s}"
            + (f"; basis {basis}" if basis else "")
        )
    if kind == "legal_hold":
        selector = preview(body.get("selector"), 80)
        return f"hold {body.get('hold')} on {selector}: {body.get('reason')!s}"
    if kind == "legal_hold_released":
        return f"hold {body.get('hold')} released: {body.get('reason')!s}"
    if kind == "retention_policy":
        days = body.get("days")
        return "retention: keep forever" if days is None else f"retention: {days} days"
    if kind in ("witness_added", "witness_removed"):
        verb = "added" if kind == "witness_added" else "removed"
        return f"witness {verb}: {body.get('name') or body.get('vkey')}: {body.get('reason')!s}"
    if kind == "witness_refused":
        return f"witness {body.get('peer')} refused: {body.get('reason')!s}"
    return None
