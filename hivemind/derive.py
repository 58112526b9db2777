"""Derived peer facts: stale summaries and new sparks, decided from the peers projection.

Runs as a writer job (inside the append transaction, after the events it reacts to), so it
reads the projection exactly as the log stands. What it decides is then *recorded* as
``peer_summary_updated`` and ``spark_suggested`` events: a replay reads those events back and
never recomputes, so the projection stays a function of the log even if the summarizer or
the spark rules change later.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from typing import Any

from archive_provider import Hasher, NewEvent, canonical_bytes

from . import events
from .peers import (
    all_peers,
    co_member_pairs,
    dismissed_pairs,
    inbound_by_peer,
    introduced_pairs,
    suggested_pairs,
)
from .sparks import detect_sparks
from .summaries import summarize
from .summarizer import SummaryRequest

SUMMARY_MESSAGES = 20  # a peer's summary covers its latest messages, at most this many


def derived_events(
    conn: sqlite3.Connection,
    hasher: Hasher,
    defer: Callable[[SummaryRequest], None] | None = None,
) -> list[NewEvent]:
    """Summaries for peers whose latest messages changed, then sparks not yet suggested.

    With ``defer``, a stale summary is handed to it (the model summarizer, which records it
    later) instead of being extracted here; sparks then use the summary the peer has now.

    A dismissed pair, a pair already introduced and a pair already in a room together with
    us are never suggested; a pair is suggested at most once.
    """
    out: list[NewEvent] = []
    summaries: dict[str, str] = {}
    current = {peer.user_id: peer for peer in all_peers(conn)}
    for user_id, rows in sorted(inbound_by_peer(conn, SUMMARY_MESSAGES).items()):
        covers = [event_id for event_id, _ in rows]
        known = current.get(user_id)
        if known is not None and known.summary_covers == hasher.digest(canonical_bytes(covers)):
            continue
        if defer is not None:
            defer(SummaryRequest(user_id, tuple(covers), tuple(text for _, text in rows)))
            continue
        summary = summarize(text for _, text in rows)
        summaries[user_id] = summary
        out.append(events.summary_updated(hasher, peer=user_id, summary=summary, covers=covers))
    interests: dict[str, dict[str, Any]] = {}
    for user_id, peer in current.items():
        about = peer.profile.get("about")
        text = " ".join(
            t
            for t in (about if isinstance(about, str) else "", summaries.get(user_id, peer.summary))
            if t
        )
        interests[user_id] = {"interests": peer.profile.get("interests", []), "summary": text}
    excluded = introduced_pairs(conn) | co_member_pairs(conn) | suggested_pairs(conn)
    for spark in detect_sparks(interests, excluded, dismissed_pairs(conn)):
        out.append(events.spark_suggested(spark.peer_a, spark.peer_b, spark.shared, spark.score))
    return out
