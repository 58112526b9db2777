"""Reading events for people: one-line summaries, full event records, short previews."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Protocol

from archive_provider.domain.authors import author_label
from archive_provider.domain.echoes import render_echoes
from archive_provider.domain.evidence import message_text
from archive_provider.format.canonical import decode
from archive_provider.format.events import StoredEvent


class Archive(Protocol):
    """What rendering reads from an archive: payload bodies by digest (local or central)."""

    def payload(self, digest: str) -> bytes | None: ...


def preview(value: Any, width: int = 60) -> str:
    """A one-line quoted preview of text (or of a value's JSON)."""
    text = (
        value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, sort_keys=True)
    )
    text = " ".join(text.split())
    return json.dumps(text if len(text) <= width else text[: width - 1] + "…", ensure_ascii=False)


def part(store: Archive, digest: Any) -> Any:
    """A part's decoded value; an erased slot's "(erased at T by seq E: reason)"; else None.

    Erasures are read from a local archive; a central one blanks erased bodies itself.
    """
    body = store.payload(digest) if isinstance(digest, str) else None
    if body is None:
        slot = _erased(store, digest)
        return f"({slot})" if slot else None
    return decode(body)


def _erased(store: Archive, digest: Any) -> str | None:
    """The erased slot of a digest in a local archive (a central one has no erasure rows)."""
    from archive_provider.audit.erasure import erased_slot
    from archive_provider.storage.store import EventStore

    if isinstance(store, EventStore) and isinstance(digest, str):
        return erased_slot(store.conn, digest)
    return None


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


def summary(store: Archive, event: StoredEvent) -> str:
    """What happened, in one line (the payload and the parts it names, briefly); and where
    the host had already masked what it handed over (why the text differs from its own)."""
    line = _what(store, event)
    masks = event.body.get("host_masks") if isinstance(event.body, Mapping) else None
    if not isinstance(masks, list) or not masks:
        return line
    kinds: dict[str, int] = {}
    for mask in masks:
        kind = str(mask.get("kind")) if isinstance(mask, Mapping) else "?"
        kinds[kind] = kinds.get(kind, 0) + 1
    return line + " [host masked: " + ", ".join(f"{k} x{n}" for k, n in kinds.items()) + "]"


def _what(store: Archive, event: StoredEvent) -> str:
    body, kind = event.body, event.type
    if not isinstance(body, Mapping):
        return preview(body)
    if kind == "turn":
        messages = [part(store, d) for d in event.messages]
        first = next(
            (m for m in messages if isinstance(m, Mapping) and m.get("role") == "user"), None
        )
        lead = _message(first if first is not None else messages[0]) if messages else "no messages"
        author = part(store, event.author_digest) if event.author_digest else None
        rewound = _rewound(store, event.seq)
        return (
            f"turn {body.get('turn')} by {author_label(author)}: {len(messages)} messages; {lead}"
            + (f" [rewound at seq {rewound}]" if rewound is not None else "")
        )
    if kind == "memory_write":
        content = part(store, body.get("content"))
        given = body.get("metadata")
        metadata: Mapping[str, Any] = given if isinstance(given, Mapping) else {}
        if not content and metadata.get("old_text"):
            matching = preview(metadata["old_text"])
            return f"{body.get('action')} {body.get('target')}: matching {matching}"
        return f"{body.get('action')} {body.get('target')}: {preview(content)}"
    if kind == "checkpoint":
        return (
            f"{len(body.get('evidence', []))} messages of evidence "
            f"(evidence digest {str(body.get('evidence_digest'))[:16]})"
        )
    if kind == "checkpoint_failed":
        return f"checkpoint failed: {preview(body.get('error', ''), 80)}"
    if kind == "recall_served":
        return (
            f"turn {body.get('turn')}: query {preview(part(store, body.get('query')), 40)}, "
            f"{len(body.get('sources', []))} sources"
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
        return f"{body.get('message_count')} messages at the end"
    if kind == "turns_rewound":
        return (
            f"{len(body.get('messages', []))} messages rewound (positions "
            f"{body.get('from_message')}..{body.get('to_message')}) after switch seq "
            f"{body.get('switch_seq')}, seen at {body.get('detected_by')}"
        )
    if kind == "delegation":
        task = preview(part(store, body.get("task")), 50)
        return f"child {body.get('child_session') or '?'}: task {task}"
    if kind == "tool_call":
        args = preview(part(store, body.get("args")), 50)
        return f"{body.get('tool')} {body.get('status') or ''}: {args}"
    if kind == "shutdown_drain":
        return (
            f"shutdown drain unfinished after {body.get('timeout_s')} s: "
            f"{body.get('pending')} queued, {body.get('spilled')} spilled, "
            f"{body.get('unwritten')} lost"
        )
    if kind == "write_failed":
        return f"{body.get('hook')}: {preview(body.get('error', ''), 80)}"
    if kind == "store_created":
        return f"archive created: store {body.get('store_id')}, format {body.get('format_version')}"
    if kind == "witness_accepted":
        head = body.get("accepted_head")
        at = f"head seq {head.get('seq')}" if isinstance(head, Mapping) else "the head"
        return f"witness accepted {at}: {body.get('reason')}"
    return fields(body, 80)


def fields(body: Mapping[str, Any], width: int | None = None) -> str:
    """``name=value`` for each field, values as plain text (nested values as compact JSON),
    cut to ``width`` characters if given: how people read a scope, a selector or a body."""
    text = " ".join(
        f"{name}={value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)}"
        for name, value in body.items()
    )
    return text if width is None or len(text) <= width else text[: width - 1] + "…"


def record(store: Archive, event: StoredEvent, *, full: bool = False) -> dict[str, Any]:
    """An event as JSON: the envelope, a summary and (``full``) its payload and parts decoded."""
    data: dict[str, Any] = {
        "seq": event.seq,
        "time": event.time,
        "type": event.type,
        "session": event.session,
        "identity": event.envelope.identity,
        "payload_digest": event.envelope.payload,
        "summary": summary(store, event),
    }
    if event.type == "turn" and isinstance(event.body, Mapping):
        digest = event.author_digest
        data["author"] = part(store, digest) if digest else None  # as the host stated it
    if full:
        data.update(
            chain=event.chain,
            key=event.key,
            payload=event.body,
            parts=[
                {"digest": d, "value": part(store, d), "erased": _erased(store, d)}
                for d in event.part_digests
            ],
        )
        echoes = event.body.get("echoes") if isinstance(event.body, Mapping) else None
        readable = callable(getattr(store, "event", None))  # a central view reads no events
        if (
            event.type in ("turn", "checkpoint")
            and isinstance(echoes, list)
            and echoes
            and readable
        ):
            for index, shown in enumerate(data["parts"]):
                shown["as_sent"] = render_echoes(
                    shown["value"], index, echoes, lambda seq: _recall_result(store, seq)
                )
        elif isinstance(echoes, list) and echoes and readable:  # a delegation's, a peer message's
            for shown in data["parts"]:
                fields = [k for k, v in event.body.items() if v == shown["digest"]]
                if any(echo.get("field") in fields for echo in echoes):
                    texts = {name: shown["value"] for name in fields}
                    sent = render_echoes(texts, None, echoes, lambda s: _recall_result(store, s))
                    shown["as_sent"] = next(sent[name] for name in fields)
    return data


def _recall_result(store: Archive, seq: Any) -> str | None:
    """The result text of the ``recall_served`` at ``seq`` (None: erased or not there)."""
    event = store.event(seq) if isinstance(seq, int) else None  # type: ignore[attr-defined]
    if event is None or event.type != "recall_served" or not isinstance(event.body, Mapping):
        return None
    digest = event.body.get("result")
    body = store.payload(digest) if isinstance(digest, str) else None
    value = decode(body) if body is not None else None
    return value if isinstance(value, str) else None


def short_time(time: str) -> str:
    """Envelope time to the second, for tables."""
    return time[:19].replace("T", " ")
