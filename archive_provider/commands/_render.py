"""Reading events for people: full event records (their one-line summary from the audit
layer's summariser, which the report shares), the log's table and times for tables."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from archive_provider.audit.summary import Archive, envelope_summary, erased, part, summary
from archive_provider.domain.echoes import render_echoes
from archive_provider.format.canonical import decode
from archive_provider.format.events import StoredEvent


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
                {"digest": d, "value": part(store, d), "erased": erased(store, d)}
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


def envelope_record(store: Archive, seq: int, *, full: bool = False) -> dict[str, Any]:
    """An event the reader does not return, its body erased (or missing): the envelope is
    still in the log, so it is shown with what became of its body (``full``: with its chain
    and key, and the erased slot, as :func:`record` gives them)."""
    row = store.conn.execute(  # type: ignore[attr-defined]
        "SELECT time, type, session, identity, payload, chain, key FROM events WHERE seq = ?",
        (seq,),
    ).fetchone()
    time, kind, session, identity, payload, chain, key = row
    identity, payload, chain = (
        value.hex() if isinstance(value, bytes) else str(value)
        for value in (identity, payload, chain)
    )
    data: dict[str, Any] = {
        "seq": seq,
        "time": time,
        "type": kind,
        "session": session,
        "identity": identity,
        "payload_digest": payload,
        "summary": envelope_summary(store, kind, payload),
    }
    if full:
        data.update(
            chain=chain,
            key=decode(str(key).encode()),
            payload=None,
            parts=[],
            erased=erased(store, payload) or "missing from the archive",
        )
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


def event_table(events: list[dict[str, Any]]) -> str:
    """``log``'s table of event records, oldest first; a central store's rows lead with
    their store's id. Session ids are the host's text, shown terminal-safe."""
    from archive_provider.format.verifier import printable

    if not events:
        return "No events match."
    width = max(len(e["type"]) for e in events)
    return "\n".join(
        (f"{e['store_id'][:8]}  " if "store_id" in e else "")
        + f"{e['seq']:>6}  {short_time(e['time'])}  {e['type']:<{width}}  "
        + f"{printable(e['session'])}  {e['summary']}"
        for e in events
    )


def short_time(time: str) -> str:
    """Envelope time to the second, for tables."""
    return time[:19].replace("T", " ")
