"""The six hivemind tools: read the peers projection, act on Matrix, log the outcome.

Every tool returns a JSON object; bad arguments, unknown or ambiguous peer names and Matrix
failures are ``{"error": ...}`` results, never exceptions. An action is logged only as what
actually happened: ``peer_message_sent`` after the homeserver returned the event id,
``peer_send_failed`` otherwise. Reading unread messages is itself an event
(``peer_messages_read``), so unread counts stay a projection of the log.
"""

from __future__ import annotations

import json
import logging
import secrets
import sqlite3
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from archive_provider import ArchiveError, EventStore, NewEvent, recall_echo_cut

from . import events
from . import peers as projection
from .context import NOTICE, PeerCard, label
from .link import PeerLink
from .matrix_backend import MatrixBackend, MatrixError, MatrixUnavailable
from .names import PeerNameError, resolve_peer

log = logging.getLogger(__name__)

T = TypeVar("T")
MAX_MESSAGE_CHARS = 20_000
MAX_CONTEXT_CHARS = 2_000
CHECK_LIMIT = 50
HISTORY_LIMIT = 20

Read = Callable[[Callable[[sqlite3.Connection], T]], T]
Record = Callable[[Callable[[EventStore], Sequence[NewEvent]], str], bool]


class ToolError(ArchiveError):
    """A result the agent should see as ``{"error": ...}`` (plus any extra fields)."""

    def __init__(self, message: str, **extra: Any) -> None:
        super().__init__(message)
        self.extra = extra


@dataclass
class PeerTools:
    """The tools of one provider: how to read its projection, log events, reach Matrix."""

    read: Read[Any]
    record: Record  # submit a job and wait (bounded); True when it was committed
    link: Callable[[], PeerLink | None]
    session: Callable[[], str]
    unavailable: Callable[[], str]  # why peers are off, when there is no link
    redact: bool = True  # mask secret-shaped spans in what we log (archive redact_secrets)

    def handle(self, name: str, args: Any) -> dict[str, Any]:
        """Run tool ``name`` (one of the provider's TOOL_NAMES, ``hivemind_<method>``)."""
        try:
            arguments = _arguments(args)
            handler = getattr(self, name.removeprefix("hivemind_"))
            return handler(arguments)
        except ToolError as exc:
            return {"error": str(exc), **exc.extra}
        except sqlite3.OperationalError as exc:  # the projection does not exist yet
            log.debug("hivemind: %s read failed: %s", name, exc)
            return {"error": "no peer state yet: the archive has not been initialized"}

    # -- reading -----------------------------------------------------------------------

    def list_peers(self, args: Mapping[str, Any]) -> dict[str, Any]:
        cards, suggestions = self.read(projection.peer_cards)
        result: dict[str, Any] = {
            "peers": [_card(card) for card in cards],
            "suggestions": [
                {
                    "peer_a": s.peer_a,
                    "peer_b": s.peer_b,
                    "names": [s.name_a, s.name_b],
                    "shared": list(s.shared),
                }
                for s in suggestions
            ],
        }
        reason = self._connection()
        result["connected"] = reason is None
        if reason is not None:
            result["not_connected_because"] = reason
        return {**result, **self._sync_problem(), "notice": NOTICE}

    def check_messages(self, args: Mapping[str, Any]) -> dict[str, Any]:
        name = _optional_text(args, "peer_name")
        peer = self._resolve(name) if name else None

        def read(conn: sqlite3.Connection) -> tuple[list[projection.Message], int, dict[str, str]]:
            found = projection.messages(conn, peer=peer, unread_only=True, limit=CHECK_LIMIT)
            counts = projection.unread_counts(conn)
            total = counts.get(peer, 0) if peer else sum(counts.values())
            names = _labels(conn)
            return found, total, names

        found, total, names = self.read(read)
        if found:
            session, ids = self.session(), [m.event_id for m in found]
            self.record(
                lambda store: [events.messages_read(store.hasher, session, ids)],
                "peer_messages_read",
            )
        return {
            "messages": [
                {
                    "from": m.peer,
                    "name": names.get(m.peer, m.peer),
                    "text": m.text,
                    "time": m.time,
                    "encrypted": m.encrypted,
                    "room_id": m.room_id,
                    "event_id": m.event_id,
                }
                for m in found
            ],
            "remaining_unread": max(0, total - len(found)),
            **self._sync_problem(),
            "notice": NOTICE,
        }

    def get_peer_info(self, args: Mapping[str, Any]) -> dict[str, Any]:
        peer = self._resolve(_required_text(args, "peer_name"))

        def read(conn: sqlite3.Connection) -> dict[str, Any]:
            known = projection.load_peer(conn, peer)
            assert known is not None  # resolved from the same table
            card = next(_card(c) for c in projection.peer_cards(conn)[0] if c.user_id == peer)
            card["profile"] = dict(known.profile)
            card["rooms"] = [
                {"room_id": room, "membership": membership}
                for room, membership in projection.rooms_of(conn, peer)
            ]
            card["messages"] = [
                {
                    "direction": "from them" if m.direction == "in" else "from us",
                    "text": m.text,
                    "time": m.time,
                    "unread": m.unread,
                    "event_id": m.event_id,
                }
                for m in projection.messages(conn, peer=peer, limit=HISTORY_LIMIT)
            ]
            return card

        return {**self.read(read), "notice": NOTICE}

    # -- acting ------------------------------------------------------------------------

    def send_to_peer(self, args: Mapping[str, Any]) -> dict[str, Any]:
        peer = self._resolve(_required_text(args, "peer_name"))
        message = _required_text(args, "message", MAX_MESSAGE_CHARS)
        txn_id = f"hivemind-{secrets.token_hex(12)}"
        session = self.session()
        room_id: str | None = None
        try:
            backend = self._backend()
            room_id = backend.direct_room_for(peer)
            event_id = backend.send_text(room_id, message, txn_id=txn_id)
        except (MatrixError, ToolError) as exc:
            raise self._failed(
                exc, "send", txn_id, [peer], message, getattr(exc, "room_id", None) or room_id
            ) from None
        logged = self.record(
            lambda store: [
                events.message_sent(
                    store.hasher,
                    session,
                    event_id=event_id,
                    room_id=room_id,
                    recipient=peer,
                    text=message,
                    txn_id=txn_id,
                    redact=self.redact,
                    cut=recall_echo_cut(store, session),
                )
            ],
            "peer_message_sent",
        )
        return {
            "sent": True,
            "to": peer,
            "event_id": event_id,
            "room_id": room_id,
            "logged": logged,
        }

    def introduce_peers(self, args: Mapping[str, Any]) -> dict[str, Any]:
        peer_a = self._resolve(_required_text(args, "peer_a"))
        peer_b = self._resolve(_required_text(args, "peer_b"))
        if peer_a == peer_b:
            raise ToolError("peer_a and peer_b are the same peer")
        context = _optional_text(args, "context", MAX_CONTEXT_CHARS).strip()
        names = self.read(_labels)
        text = f"Introduction: {names[peer_a]} ({peer_a}), meet {names[peer_b]} ({peer_b})." + (
            f" Why: {context}" if context else ""
        )
        session, txn_id = self.session(), f"hivemind-{secrets.token_hex(12)}"
        try:
            backend = self._backend()
            room_id = backend.create_introduction_room(peer_a, peer_b, text)
        except (MatrixError, ToolError) as exc:
            raise self._failed(
                exc, "introduce", txn_id, [peer_a, peer_b], text, getattr(exc, "room_id", None)
            ) from None
        own = backend.user_id
        logged = self.record(
            lambda store: [
                events.introduction_made(
                    store.hasher,
                    session,
                    room_id=room_id,
                    introducer=own,
                    peers=[peer_a, peer_b],
                    context=context,
                    redact=self.redact,
                )
            ],
            "peers_introduced",
        )
        return {"introduced": [peer_a, peer_b], "room_id": room_id, "text": text, "logged": logged}

    def dismiss_spark(self, args: Mapping[str, Any]) -> dict[str, Any]:
        peer_a = self._resolve(_required_text(args, "peer_a"))
        peer_b = self._resolve(_required_text(args, "peer_b"))
        if peer_a == peer_b:
            raise ToolError("peer_a and peer_b are the same peer")
        pair = tuple(sorted((peer_a, peer_b)))
        suggested = self.read(lambda conn: pair in projection.suggested_pairs(conn))
        session = self.session()
        logged = self.record(
            lambda store: [events.spark_dismissed(session, peer_a, peer_b)], "spark_dismissed"
        )
        return {"dismissed": list(pair), "was_suggested": suggested, "logged": logged}

    # -- plumbing ----------------------------------------------------------------------

    def _failed(
        self,
        exc: Exception,
        action: str,
        txn_id: str,
        recipients: list[str],
        text: str,
        room_id: str | None,
    ) -> ToolError:
        """Log the attempt the homeserver did not acknowledge; the error the agent sees."""
        session, error = self.session(), str(exc)
        retryable = not isinstance(exc, MatrixError) or isinstance(exc, MatrixUnavailable)
        logged = self.record(
            lambda store: [
                events.send_failed(
                    store.hasher,
                    session,
                    txn_id=txn_id,
                    recipients=recipients,
                    text=text,
                    error=error,
                    retryable=retryable,
                    room_id=room_id,
                    action=action,
                    redact=self.redact,
                )
            ],
            "peer_send_failed",
        )
        done = "sent" if action == "send" else "introduced"
        return ToolError(
            f"not {done}: {error}",
            **{done: False},
            room_id=room_id,
            retryable=retryable,
            logged=logged,
        )

    def _resolve(self, name: str) -> str:
        known = self.read(projection.peer_names)
        try:
            return resolve_peer(name, known)
        except PeerNameError as exc:
            raise ToolError(str(exc), candidates=list(getattr(exc, "candidates", ()))) from None

    def _connection(self) -> str | None:
        """Why Matrix is out of reach right now, or None when it is connected."""
        link = self.link()
        if link is None:
            return self.unavailable()
        if link.backend is not None:
            return None
        return link.error or "still connecting to the homeserver"

    def _sync_problem(self) -> dict[str, str]:
        """``{"sync_problem": why}`` while connected but syncs keep failing (news may be stale)."""
        link = self.link()
        if link is None or link.backend is None or not link.error:
            return {}
        return {"sync_problem": link.error}

    def _backend(self) -> MatrixBackend:
        link = self.link()
        backend = link.backend if link is not None else None
        if backend is None:
            raise ToolError(f"not connected to Matrix ({self._connection()})")
        return backend


def _labels(conn: sqlite3.Connection) -> dict[str, str]:
    return {p: label(p, n) for p, n in projection.peer_names(conn).items()}


def _card(card: PeerCard) -> dict[str, Any]:
    return {
        "user_id": card.user_id,
        "name": card.name,
        "introduced_by": card.introduced_by,
        "about": card.about,
        "interests": list(card.interests),
        "summary": card.summary,
        "unread": card.unread,
    }


def _arguments(args: Any) -> Mapping[str, Any]:
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except ValueError:
            raise ToolError("arguments must be a JSON object") from None
    if args is None:
        return {}
    if not isinstance(args, Mapping):
        raise ToolError("arguments must be an object")
    return args


def _required_text(args: Mapping[str, Any], key: str, limit: int = 500) -> str:
    value = args.get(key)
    if not isinstance(value, str) or not value.strip():
        raise ToolError(f"'{key}' is required (non-empty text)")
    if len(value) > limit:
        raise ToolError(f"'{key}' is longer than {limit} characters")
    return value


def _optional_text(args: Mapping[str, Any], key: str, limit: int = 500) -> str:
    value = args.get(key)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise ToolError(f"'{key}' must be text")
    if len(value) > limit:
        raise ToolError(f"'{key}' is longer than {limit} characters")
    return value
