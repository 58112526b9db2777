"""The peers projection: what this agent knows about other agents, rebuilt from its log.

Peers (user id, display name, profile, summary), the rooms they share with us, messages
both ways with their unread flag, introductions, suggested introductions (sparks) and
dismissals, and the Matrix sync position. It handles only peer events, so for a plain
archive profile its tables stay empty.

The reducers are pure functions over plain values (:class:`Peer` and event bodies); the
projection is the thin SQLite shell that loads a row, applies a reducer and stores the
result. Every row is a function of the log alone (sequence numbers and envelope times, never
the clock), so a replay reproduces the same digest. Odd payloads never raise: a field of the
wrong type reads as missing. Nothing here imports Matrix.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, TypeGuard

from archive_provider import (
    StoredEvent,
    TableProjection,
    bindable_text,
    canonical_text,
    decode,
    part_body,
)

from .context import PeerCard, SuggestionCard, label
from .sparks import pair_key

KNOWN_MEMBERSHIPS = ("join", "invite")


# -- pure reducers ---------------------------------------------------------------------


@dataclass(frozen=True)
class Peer:
    """One known peer as the projection holds it."""

    user_id: str
    display_name: str | None = None
    profile: Mapping[str, Any] = field(default_factory=dict)
    summary: str = ""
    summary_covers: str = ""
    first_seq: int = 0
    last_seq: int = 0


def _text(value: Any) -> str | None:
    return bindable_text(value) if isinstance(value, str) else None


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def is_user_id(value: Any) -> TypeGuard[str]:
    """``@local:server`` text SQLite can bind (a lone surrogate is no Matrix id)."""
    if not isinstance(value, str) or not value.startswith("@") or bindable_text(value) != value:
        return False
    local, sep, server = value[1:].partition(":")
    return bool(local and sep and server)


def touch(peer: Peer | None, user_id: str, seq: int) -> Peer:
    """The peer, known from ``seq`` on (a message or an introduction names it)."""
    if peer is None:
        return Peer(bindable_text(user_id), first_seq=seq, last_seq=seq)
    return replace(peer, last_seq=seq)


def seen(peer: Peer | None, body: Mapping[str, Any], seq: int) -> Peer | None:
    """Apply a ``peer_seen`` body; None when it does not make anyone known.

    A membership other than join or invite (someone who left before we arrived) names a
    user without making it a peer; for a known peer it changes nothing but recency.
    """
    user_id = body.get("user_id")
    if not is_user_id(user_id):
        return None
    source = body.get("source")
    if source == "member":
        if peer is None and body.get("membership") not in KNOWN_MEMBERSHIPS:
            return None
        peer = touch(peer, user_id, seq)
        name = _text(body.get("display_name"))
        return replace(peer, display_name=name) if name else peer
    if source == "profile":
        profile = _mapping(body.get("profile"))
        return replace(touch(peer, user_id, seq), profile=dict(profile))
    if source == "contact":
        return peer or touch(None, user_id, seq)
    return peer


def summarized(peer: Peer | None, user_id: str, summary: str, covers: str, seq: int) -> Peer:
    return replace(touch(peer, user_id, seq), summary=summary, summary_covers=covers)


def message_peer(event_type: str, body: Mapping[str, Any]) -> str | None:
    """The peer a message event is about: the sender of what we received, else the recipient."""
    who = body.get("sender" if event_type == "peer_message_received" else "recipient")
    return who if is_user_id(who) else None


def read_ids(body: Mapping[str, Any]) -> list[str]:
    ids = body.get("messages")
    return sorted({i for i in ids if isinstance(i, str)}) if isinstance(ids, list) else []


def pair_of(body: Mapping[str, Any]) -> tuple[str, str] | None:
    a, b = body.get("peer_a"), body.get("peer_b")
    if not (is_user_id(a) and is_user_id(b)) or a == b:
        return None
    return pair_key(a, b)


def introduced_pair(body: Mapping[str, Any]) -> tuple[str, str] | None:
    peers = body.get("peers")
    if not isinstance(peers, list) or len(peers) != 2 or not all(map(is_user_id, peers)):
        return None
    if peers[0] == peers[1]:
        return None
    return pair_key(peers[0], peers[1])


# -- the SQLite shell ------------------------------------------------------------------


def _part_text(conn: sqlite3.Connection, event: StoredEvent, digest: Any) -> str:
    """A text part the event names: carried by a replayed event, else from the payloads table."""
    if not isinstance(digest, str):
        return ""
    raw = part_body(conn, event, digest)
    value = decode(raw) if raw is not None else None
    return bindable_text(value) if isinstance(value, str) else ""


class PeersProjection(TableProjection):
    """Peer state for hivemind (see the module docstring)."""

    name = "peers"
    version = 3
    ddl = (
        "CREATE TABLE IF NOT EXISTS peers (user_id TEXT PRIMARY KEY, display_name TEXT,"
        " profile TEXT NOT NULL, summary TEXT NOT NULL, summary_covers TEXT NOT NULL,"
        " first_seq INTEGER NOT NULL, last_seq INTEGER NOT NULL)",
        "CREATE TABLE IF NOT EXISTS peer_rooms (room_id TEXT NOT NULL, user_id TEXT NOT NULL,"
        " membership TEXT NOT NULL, seq INTEGER NOT NULL, PRIMARY KEY (room_id, user_id))",
        "CREATE TABLE IF NOT EXISTS peer_messages (event_id TEXT PRIMARY KEY, seq INTEGER NOT NULL,"
        " time TEXT NOT NULL, room_id TEXT NOT NULL, peer TEXT NOT NULL, direction TEXT NOT NULL,"
        " text TEXT NOT NULL, origin_ts INTEGER, encrypted INTEGER, unread INTEGER NOT NULL)",
        "CREATE INDEX IF NOT EXISTS peer_messages_peer ON peer_messages(peer, seq)",
        "CREATE INDEX IF NOT EXISTS peer_messages_unread ON peer_messages(unread, seq)",
        "CREATE TABLE IF NOT EXISTS peer_introductions (room_id TEXT PRIMARY KEY,"
        " seq INTEGER NOT NULL, introducer TEXT NOT NULL, peer_a TEXT NOT NULL,"
        " peer_b TEXT NOT NULL, outgoing INTEGER NOT NULL, context TEXT NOT NULL)",
        "CREATE TABLE IF NOT EXISTS peer_sparks (peer_a TEXT NOT NULL, peer_b TEXT NOT NULL,"
        " seq INTEGER NOT NULL, shared TEXT NOT NULL, score INTEGER NOT NULL,"
        " PRIMARY KEY (peer_a, peer_b))",
        "CREATE TABLE IF NOT EXISTS peer_dismissals (peer_a TEXT NOT NULL, peer_b TEXT NOT NULL,"
        " seq INTEGER NOT NULL, PRIMARY KEY (peer_a, peer_b))",
        "CREATE TABLE IF NOT EXISTS peer_sync (id INTEGER PRIMARY KEY CHECK (id = 1),"
        " next_batch TEXT NOT NULL, seq INTEGER NOT NULL)",
        "CREATE TABLE IF NOT EXISTS peer_link (id INTEGER PRIMARY KEY CHECK (id = 1),"
        " state TEXT NOT NULL, since TEXT NOT NULL, error TEXT NOT NULL, seq INTEGER NOT NULL)",
        "CREATE TABLE IF NOT EXISTS peer_witness_alerts (peer TEXT PRIMARY KEY,"
        " reason TEXT NOT NULL, time TEXT NOT NULL, seq INTEGER NOT NULL)",
        "CREATE TABLE IF NOT EXISTS peer_model_calls (seq INTEGER PRIMARY KEY, time TEXT NOT NULL)",
        "CREATE INDEX IF NOT EXISTS peer_model_calls_time ON peer_model_calls(time)",
    )
    tables = {
        "peers": "user_id",
        "peer_rooms": "room_id, user_id",
        "peer_messages": "seq, event_id",
        "peer_introductions": "room_id",
        "peer_sparks": "peer_a, peer_b",
        "peer_dismissals": "peer_a, peer_b",
        "peer_sync": "id",
        "peer_link": "id",
        "peer_model_calls": "seq",
        "peer_witness_alerts": "peer",
    }
    handles = frozenset(
        {
            "peer_seen",
            "peer_message_received",
            "peer_message_sent",
            "peer_messages_read",
            "peers_introduced",
            "spark_suggested",
            "spark_dismissed",
            "peer_summary_updated",
            "peer_sync_position",
            "peer_link_state",
            "peer_witness_refused",
        }
    )

    def reduce(self, conn: sqlite3.Connection, event: StoredEvent) -> None:
        body, seq, kind = _mapping(event.body), event.seq, event.type
        if kind == "peer_seen":
            self._seen(conn, body, seq)
        elif kind in ("peer_message_received", "peer_message_sent"):
            self._message(conn, event, body)
        elif kind == "peer_messages_read":
            conn.executemany(
                "UPDATE peer_messages SET unread = 0 WHERE event_id = ?",
                [(i,) for i in read_ids(body)],
            )
        elif kind == "peers_introduced":
            self._introduced(conn, event, body)
        elif kind == "peer_summary_updated":
            if "prompt_digest" in body:  # the host's model was asked (answered or not)
                conn.execute("INSERT INTO peer_model_calls VALUES (?, ?)", (seq, event.time))
            peer = body.get("peer")
            if is_user_id(peer):
                covers = body.get("covers_digest")
                summary = _part_text(conn, event, body.get("summary"))
                self._store(
                    conn,
                    summarized(
                        load_peer(conn, peer),
                        peer,
                        summary,
                        covers if isinstance(covers, str) else "",
                        seq,
                    ),
                )
        elif kind in ("spark_suggested", "spark_dismissed"):
            self._pair(conn, kind, body, seq)
        elif kind == "peer_link_state":
            state, error = body.get("state"), body.get("error")
            if state in ("offline", "online"):
                conn.execute(
                    "INSERT INTO peer_link VALUES (1, ?, ?, ?, ?) ON CONFLICT(id) DO UPDATE"
                    " SET state = excluded.state, since = excluded.since,"
                    " error = excluded.error, seq = excluded.seq",
                    (state, event.time, _text(error) or "", seq),
                )
        elif kind == "peer_witness_refused":
            peer, reason = body.get("peer"), _text(body.get("reason"))
            if is_user_id(peer):
                conn.execute(
                    "INSERT INTO peer_witness_alerts VALUES (?, ?, ?, ?) ON CONFLICT(peer)"
                    " DO UPDATE SET reason = excluded.reason, time = excluded.time,"
                    " seq = excluded.seq",
                    (peer, bindable_text(reason or ""), event.time, seq),
                )
        elif kind == "peer_sync_position":
            token = body.get("next_batch")
            if isinstance(token, str) and token:
                conn.execute(
                    "INSERT INTO peer_sync VALUES (1, ?, ?) ON CONFLICT(id) DO UPDATE"
                    " SET next_batch = excluded.next_batch, seq = excluded.seq",
                    (bindable_text(token), seq),
                )

    def _seen(self, conn: sqlite3.Connection, body: Mapping[str, Any], seq: int) -> None:
        user_id = body.get("user_id")
        if not is_user_id(user_id):
            return
        updated = seen(load_peer(conn, user_id), body, seq)
        if updated is not None:
            self._store(conn, updated)
        room, membership = body.get("room_id"), body.get("membership")
        if body.get("source") == "member" and isinstance(room, str) and isinstance(membership, str):
            conn.execute(
                "INSERT INTO peer_rooms VALUES (?, ?, ?, ?) ON CONFLICT(room_id, user_id)"
                " DO UPDATE SET membership = excluded.membership, seq = excluded.seq",
                (bindable_text(room), bindable_text(user_id), bindable_text(membership), seq),
            )

    def _message(
        self, conn: sqlite3.Connection, event: StoredEvent, body: Mapping[str, Any]
    ) -> None:
        peer = message_peer(event.type, body)
        key = _mapping(event.key).get("event_id")
        if peer is None or not isinstance(key, str):
            return
        incoming = event.type == "peer_message_received"
        ts = body.get("origin_server_ts")
        conn.execute(
            "INSERT OR IGNORE INTO peer_messages VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                bindable_text(key),
                event.seq,
                event.time,
                _text(body.get("room_id")) or "",
                peer,
                "in" if incoming else "out",
                _part_text(conn, event, body.get("text")),
                ts if isinstance(ts, int) else None,
                int(bool(body.get("encrypted"))),
                int(incoming),
            ),
        )
        self._store(conn, touch(load_peer(conn, peer), peer, event.seq))

    def _introduced(
        self, conn: sqlite3.Connection, event: StoredEvent, body: Mapping[str, Any]
    ) -> None:
        pair, room, introducer = introduced_pair(body), body.get("room_id"), body.get("introducer")
        if pair is None or not isinstance(room, str) or not is_user_id(introducer):
            return
        conn.execute(
            "INSERT OR IGNORE INTO peer_introductions VALUES (?, ?, ?, ?, ?, ?, ?)",
            (
                bindable_text(room),
                event.seq,
                introducer,
                *pair,
                int(bool(body.get("outgoing"))),
                _part_text(conn, event, body.get("context")),
            ),
        )

    @staticmethod
    def _pair(conn: sqlite3.Connection, kind: str, body: Mapping[str, Any], seq: int) -> None:
        pair = pair_of(body)
        if pair is None:
            return
        if kind == "spark_dismissed":
            conn.execute("INSERT OR IGNORE INTO peer_dismissals VALUES (?, ?, ?)", (*pair, seq))
            return
        shared = body.get("shared")
        words = [w for w in shared if isinstance(w, str)] if isinstance(shared, list) else []
        score = body.get("score")
        conn.execute(
            "INSERT OR IGNORE INTO peer_sparks VALUES (?, ?, ?, ?, ?)",
            (*pair, seq, canonical_text(words), score if isinstance(score, int) else 0),
        )

    @staticmethod
    def _store(conn: sqlite3.Connection, peer: Peer) -> None:
        conn.execute(
            "INSERT INTO peers VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT(user_id) DO UPDATE SET"
            " display_name = excluded.display_name, profile = excluded.profile,"
            " summary = excluded.summary, summary_covers = excluded.summary_covers,"
            " last_seq = excluded.last_seq",
            (
                peer.user_id,
                peer.display_name,
                canonical_text(dict(peer.profile)),
                peer.summary,
                peer.summary_covers,
                peer.first_seq,
                peer.last_seq,
            ),
        )


# -- queries (the read side: tools, prefetch, derivations) ------------------------------


def load_peer(conn: sqlite3.Connection, user_id: str) -> Peer | None:
    row = conn.execute(
        "SELECT user_id, display_name, profile, summary, summary_covers, first_seq, last_seq"
        " FROM peers WHERE user_id = ?",
        (user_id,),
    ).fetchone()
    if row is None:
        return None
    profile = decode(row[2])
    return Peer(row[0], row[1], profile if isinstance(profile, dict) else {}, *row[3:])


def all_peers(conn: sqlite3.Connection) -> list[Peer]:
    """Every known peer, most recently active first."""
    ids = [r[0] for r in conn.execute("SELECT user_id FROM peers ORDER BY last_seq DESC, user_id")]
    return [p for p in (load_peer(conn, i) for i in ids) if p is not None]


def peer_names(conn: sqlite3.Connection) -> dict[str, str | None]:
    """user id -> display name, for :func:`hivemind.names.resolve_peer`."""
    return dict(conn.execute("SELECT user_id, display_name FROM peers"))


def introducer_of(conn: sqlite3.Connection, user_id: str) -> str | None:
    """Who first introduced ``user_id`` to us (an introduction we did not make)."""
    row = conn.execute(
        "SELECT introducer FROM peer_introductions WHERE outgoing = 0 AND introducer != ?"
        " AND (peer_a = ? OR peer_b = ?) ORDER BY seq LIMIT 1",
        (user_id, user_id, user_id),
    ).fetchone()
    return row[0] if row else None


def unread_counts(conn: sqlite3.Connection) -> dict[str, int]:
    return dict(
        conn.execute("SELECT peer, count(*) FROM peer_messages WHERE unread = 1 GROUP BY peer")
    )


@dataclass(frozen=True)
class Message:
    event_id: str
    seq: int
    time: str
    room_id: str
    peer: str
    direction: str  # "in" (from the peer) or "out" (from us)
    text: str
    encrypted: bool
    unread: bool


def messages(
    conn: sqlite3.Connection,
    *,
    peer: str | None = None,
    unread_only: bool = False,
    limit: int = 50,
) -> list[Message]:
    """Messages in log order (the latest ``limit`` of them)."""
    where, args = [], []
    if peer is not None:
        where.append("peer = ?")
        args.append(peer)
    if unread_only:
        where.append("unread = 1")
    clause = f" WHERE {' AND '.join(where)}" if where else ""
    rows = conn.execute(
        "SELECT event_id, seq, time, room_id, peer, direction, text, encrypted, unread"
        f" FROM peer_messages{clause} ORDER BY seq DESC LIMIT ?",
        (*args, limit),
    ).fetchall()
    return [
        Message(
            event_id=r[0],
            seq=r[1],
            time=r[2],
            room_id=r[3],
            peer=r[4],
            direction=r[5],
            text=r[6],
            encrypted=bool(r[7]),
            unread=bool(r[8]),
        )
        for r in reversed(rows)
    ]


def inbound_by_peer(conn: sqlite3.Connection, per_peer: int) -> dict[str, list[tuple[str, str]]]:
    """peer -> its latest ``per_peer`` received (event id, text), oldest first."""
    out: dict[str, list[tuple[str, str]]] = {}
    for peer, event_id, text in conn.execute(
        "SELECT peer, event_id, text FROM (SELECT peer, event_id, text, seq, row_number() OVER"
        " (PARTITION BY peer ORDER BY seq DESC) AS n FROM peer_messages WHERE direction = 'in')"
        " WHERE n <= ? ORDER BY peer, seq",
        (per_peer,),
    ):
        out.setdefault(peer, []).append((event_id, text))
    return out


def rooms_of(conn: sqlite3.Connection, user_id: str) -> list[tuple[str, str]]:
    return list(
        conn.execute(
            "SELECT room_id, membership FROM peer_rooms WHERE user_id = ? ORDER BY room_id",
            (user_id,),
        )
    )


def introduced_pairs(conn: sqlite3.Connection) -> set[tuple[str, str]]:
    return {(a, b) for a, b in conn.execute("SELECT peer_a, peer_b FROM peer_introductions")}


def dismissed_pairs(conn: sqlite3.Connection) -> set[tuple[str, str]]:
    return {(a, b) for a, b in conn.execute("SELECT peer_a, peer_b FROM peer_dismissals")}


def suggested_pairs(conn: sqlite3.Connection) -> set[tuple[str, str]]:
    return {(a, b) for a, b in conn.execute("SELECT peer_a, peer_b FROM peer_sparks")}


def co_member_pairs(conn: sqlite3.Connection) -> set[tuple[str, str]]:
    """Pairs of peers already in a room together with us: they can talk without us."""
    rows = conn.execute(
        "SELECT a.user_id, b.user_id FROM peer_rooms a JOIN peer_rooms b ON a.room_id = b.room_id"
        " AND a.user_id < b.user_id WHERE a.membership IN ('join', 'invite')"
        " AND b.membership IN ('join', 'invite')"
    )
    return {(a, b) for a, b in rows}


@dataclass(frozen=True)
class Suggestion:
    peer_a: str
    peer_b: str
    shared: tuple[str, ...]
    score: int


def active_suggestions(conn: sqlite3.Connection) -> list[Suggestion]:
    """Suggested pairs not dismissed and not introduced since, best first."""
    rows = conn.execute(
        "SELECT s.peer_a, s.peer_b, s.shared, s.score FROM peer_sparks s"
        " WHERE NOT EXISTS (SELECT 1 FROM peer_dismissals d WHERE d.peer_a = s.peer_a"
        " AND d.peer_b = s.peer_b) AND NOT EXISTS (SELECT 1 FROM peer_introductions i"
        " WHERE i.peer_a = s.peer_a AND i.peer_b = s.peer_b)"
        " ORDER BY s.score DESC, s.peer_a, s.peer_b"
    )
    out = []
    for a, b, shared, score in rows:
        words = decode(shared)
        out.append(Suggestion(a, b, tuple(words) if isinstance(words, list) else (), score))
    return out


def sync_token(conn: sqlite3.Connection) -> str | None:
    row = conn.execute("SELECT next_batch FROM peer_sync WHERE id = 1").fetchone()
    return row[0] if row else None


def model_calls_since(conn: sqlite3.Connection, since: str) -> list[str]:
    """Envelope times of the model calls summaries made from ``since`` on (oldest first):
    what the hourly budget has spent, read back from the log after a restart."""
    rows = conn.execute(
        "SELECT time FROM peer_model_calls WHERE time >= ? ORDER BY time", (since,)
    ).fetchall()
    return [row[0] for row in rows]


def link_offline(conn: sqlite3.Connection) -> tuple[str, str] | None:
    """(since, error) while the log says the homeserver stopped answering, else None."""
    row = conn.execute("SELECT state, since, error FROM peer_link WHERE id = 1").fetchone()
    return (row[1], row[2]) if row and row[0] == "offline" else None


def peer_cards(conn: sqlite3.Connection) -> tuple[list[PeerCard], list[SuggestionCard]]:
    """Every peer as the agent is shown it (block and tools alike), and active suggestions."""
    known = all_peers(conn)
    names = {p.user_id: label(p.user_id, p.display_name) for p in known}
    unread = unread_counts(conn)
    alerts = dict(
        conn.execute("SELECT peer, time || ': ' || reason FROM peer_witness_alerts").fetchall()
    )
    cards = []
    for peer in known:
        introducer = introducer_of(conn, peer.user_id)
        listed, about = peer.profile.get("interests"), peer.profile.get("about")
        cards.append(
            PeerCard(
                peer.user_id,
                names[peer.user_id],
                introduced_by=names.get(introducer, introducer) if introducer else None,
                about=about if isinstance(about, str) else "",
                interests=tuple(i for i in listed if isinstance(i, str))
                if isinstance(listed, list)
                else (),
                summary=peer.summary,
                unread=unread.get(peer.user_id, 0),
                witness_alert=alerts.get(peer.user_id, ""),
            )
        )
    suggestions = [
        SuggestionCard(
            s.peer_a,
            s.peer_b,
            names.get(s.peer_a, s.peer_a),
            names.get(s.peer_b, s.peer_b),
            s.shared,
        )
        for s in active_suggestions(conn)
    ]
    return cards, suggestions
