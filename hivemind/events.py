"""Peer events: Matrix facts and peer-tool outcomes in, :class:`NewEvent` out.

Pure given the store's keyed hasher, like :mod:`archive_provider.domain.builders`. Each builder
decides what makes its event *that* event (its identity key), so a fact delivered twice
(a resync, a restart from an older sync token) is stored once:

* ``peer_seen``: the member or profile state event id (a configured contact: its user id);
* ``peer_message_received`` / ``peer_message_undecryptable``: the Matrix event id;
* ``peer_message_sent``: the event id the homeserver returned (only after it accepted);
* ``peer_send_failed``: the transaction id of the failed attempt;
* ``peers_introduced``: the introduction room;
* ``spark_suggested`` / ``spark_dismissed``: the unordered pair;
* ``peer_summary_updated``: the peer and a digest of the message ids the summary covers;
* ``peer_messages_read``: a digest of the message ids marked read;
* ``peer_invite_ignored``: the room and the inviter;
* ``peer_input_rejected``: the Matrix event id (else the digest of the raw event);
* ``peer_link_state``: the state (``offline``/``online``) and the clock time of the change;
* ``peer_witness_refused``: the peer and a digest of the checkpoint it offered;
* ``peer_sync_position``: the sync token, appended in the same transaction as the events
  of that sync, so a restart resumes from the last sync whose events are all in the log.

Texts written by peers (messages, introduction contexts, summaries) are parts, stored once by
digest and erasable later without breaking the chain. Everything here is peer-controlled and
untrusted: builders bound its size, nothing more.

Redaction (the archive's ``redact_secrets``) covers every builder on every path: each text
part and each body goes through :func:`_event`, which masks secret-shaped spans when
``redact`` is on (the default), so a failed send or introduction is masked like a sent one.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from archive_provider import (
    Hasher,
    NewEvent,
    Part,
    archivable_text,
    canonical_bytes,
    now_text,
    redact_value,
    with_redactions,
)

from .sparks import pair_key

if TYPE_CHECKING:
    from concurrent.futures import Future

    from archive_provider import AppendResult, EventStore

    from .matrix_backend import SyncResult

#: how hivemind's parts append through the provider's writer: a function building events
#: from the store, and what they are for; the writer's future of their results
Submit = Callable[[Callable[["EventStore"], Sequence[NewEvent]], str], "Future[list[AppendResult]]"]

PEER_SESSION = ""  # peer events belong to no conversation unless a tool call made them
MAX_NAME_CHARS = 200
MAX_ABOUT_CHARS = 1000
MAX_INTERESTS = 32
MAX_INTEREST_CHARS = 100
MAX_ERROR_CHARS = 500
MAX_REJECTED_CHARS = 16 * 1024


def _event(
    event_type: str,
    session: str,
    key: Mapping[str, Any],
    body: dict[str, Any],
    parts: Sequence[Part] = (),
    found: Sequence[Mapping[str, Any]] = (),
    *,
    redact: bool,
) -> NewEvent:
    """The one way a peer event is made: its body masked too when ``redact`` (digests and
    ids never match a pattern), and every redaction, its parts' first, listed."""
    masked, more = redact_value(body) if redact else (body, [])
    return NewEvent(
        event_type, session, key, with_redactions(masked, [*found, *more]), tuple(parts)
    )


def _text(value: Any, limit: int) -> str:
    return archivable_text(value)[:limit] if isinstance(value, str) else ""


def clean_profile(profile: Mapping[str, Any]) -> dict[str, Any]:
    """The profile fields hivemind uses (``name``, ``about``, ``interests``), bounded."""
    out: dict[str, Any] = {}
    for key, limit in (("name", MAX_NAME_CHARS), ("about", MAX_ABOUT_CHARS)):
        text = _text(profile.get(key), limit).strip()
        if text:
            out[key] = text
    interests = profile.get("interests")
    items = [interests] if isinstance(interests, str) else interests
    if isinstance(items, (list, tuple)):
        kept = [_text(i, MAX_INTEREST_CHARS).strip() for i in items if isinstance(i, str)]
        kept = [i for i in kept if i][:MAX_INTERESTS]
        if kept:
            out["interests"] = kept
    return out


def member_seen(
    room_id: str,
    user_id: str,
    display_name: str | None,
    membership: str,
    event_id: str,
    *,
    redact: bool = True,
) -> NewEvent:
    """A membership event of another user in a room we are in."""
    body: dict[str, Any] = {
        "source": "member",
        "user_id": user_id,
        "room_id": room_id,
        "membership": _text(membership, 32),
    }
    if display_name:
        body["display_name"] = _text(display_name, MAX_NAME_CHARS)
    key = {"source": "member", "event_id": event_id}
    return _event("peer_seen", PEER_SESSION, key, body, redact=redact)


def profile_seen(
    room_id: str,
    user_id: str,
    event_id: str,
    origin_server_ts: int,
    profile: Mapping[str, Any],
    *,
    redact: bool = True,
) -> NewEvent:
    """A peer's self-published profile (state keyed by its own user id)."""
    return _event(
        "peer_seen",
        PEER_SESSION,
        {"source": "profile", "event_id": event_id},
        {
            "source": "profile",
            "user_id": user_id,
            "room_id": room_id,
            "origin_server_ts": origin_server_ts,
            "profile": clean_profile(profile),
        },
        redact=redact,
    )


def contact_seen(user_id: str, *, redact: bool = True) -> NewEvent:
    """A peer the operator configured as a contact: known before any room is shared."""
    return _event(
        "peer_seen",
        PEER_SESSION,
        {"source": "contact", "user_id": user_id},
        {"source": "contact", "user_id": user_id},
        redact=redact,
    )


def _text_part(
    hasher: Hasher, text: str, redact: bool, path: str = "/text"
) -> tuple[Part, list[dict[str, Any]]]:
    """A peer's text as a part, secret-shaped spans masked when ``redact`` (as for turns)."""
    value, found = _masked_text(text, redact, path)
    return hasher.part(value), found


def _masked_text(text: str, redact: bool, path: str) -> tuple[str, list[dict[str, Any]]]:
    """A peer's text as archived, and the secret-shaped spans masked in it when ``redact``."""
    return redact_value(archivable_text(text), path) if redact else (archivable_text(text), [])


def message_received(
    hasher: Hasher,
    *,
    event_id: str,
    room_id: str,
    sender: str,
    text: str,
    origin_server_ts: int,
    encrypted: bool,
    redact: bool = True,
    msgtype: str = "m.text",
    backfilled: bool = False,
) -> NewEvent:
    """A peer's message; ``msgtype`` is recorded when it is not plain text (``m.text``), and
    ``backfilled`` when it came from ``/messages`` after a sync gap rather than from a sync."""
    part, found = _text_part(hasher, text, redact)
    body: dict[str, Any] = {
        "room_id": room_id,
        "sender": sender,
        "text": part.digest,
        "origin_server_ts": origin_server_ts,
        "encrypted": encrypted,
    }
    if msgtype != "m.text":
        body["msgtype"] = archivable_text(msgtype)
    if backfilled:
        body["backfilled"] = True
    key = {"event_id": event_id}
    return _event("peer_message_received", PEER_SESSION, key, body, (part,), found, redact=redact)


def message_undecryptable(
    *,
    event_id: str,
    room_id: str,
    sender: str,
    origin_server_ts: int,
    session_id: str,
    redact: bool = True,
) -> NewEvent:
    return _event(
        "peer_message_undecryptable",
        PEER_SESSION,
        {"event_id": event_id},
        {
            "room_id": room_id,
            "sender": sender,
            "origin_server_ts": origin_server_ts,
            "megolm_session": session_id,
        },
        redact=redact,
    )


def input_rejected(
    hasher: Hasher,
    *,
    room_id: str,
    event_id: str,
    sender: str,
    event_type: str,
    reason: str,
    source: Mapping[str, Any],
    backfilled: bool = False,
    redact: bool = True,
) -> NewEvent:
    """An event from a room we are in that matrix-nio could not parse: kept, never used.

    The raw event is a part (bounded, erasable); identity is its event id, else its digest.
    """
    raw = json.dumps(dict(source), ensure_ascii=False, sort_keys=True, default=str)
    part, found = _text_part(hasher, raw[:MAX_REJECTED_CHARS], redact, "/source")
    body: dict[str, Any] = {
        "room_id": room_id,
        "event_type": _text(event_type, MAX_NAME_CHARS),
        "reason": _text(reason, MAX_ERROR_CHARS),
        "source": part.digest,
    }
    if sender:
        body["sender"] = _text(sender, MAX_NAME_CHARS)
    if backfilled:
        body["backfilled"] = True
    key = {"event_id": event_id} if event_id else {"source": part.digest}
    return _event("peer_input_rejected", PEER_SESSION, key, body, (part,), found, redact=redact)


def invite_ignored(*, room_id: str, inviter: str, is_direct: bool, redact: bool = True) -> NewEvent:
    """An invite the policy refused: we did not join, so nothing from that room reaches us."""
    return _event(
        "peer_invite_ignored",
        PEER_SESSION,
        {"room_id": room_id, "inviter": inviter},
        {"room_id": room_id, "inviter": inviter, "is_direct": is_direct},
        redact=redact,
    )


def introduction_seen(
    hasher: Hasher,
    *,
    room_id: str,
    introducer: str,
    peers: Sequence[str],
    event_id: str,
    redact: bool = True,
) -> NewEvent:
    """Someone introduced us (one of ``peers``) in ``room_id``; the sender is the introducer."""
    return _introduced(
        hasher, PEER_SESSION, room_id, introducer, peers, "", event_id, False, redact
    )


def introduction_made(
    hasher: Hasher,
    session: str,
    *,
    room_id: str,
    introducer: str,
    peers: Sequence[str],
    context: str,
    redact: bool = True,
) -> NewEvent:
    """We introduced two peers (the room exists and the introduction text was accepted)."""
    return _introduced(hasher, session, room_id, introducer, peers, context, "", True, redact)


def _introduced(
    hasher: Hasher,
    session: str,
    room_id: str,
    introducer: str,
    peers: Sequence[str],
    context: str,
    event_id: str,
    outgoing: bool,
    redact: bool,
) -> NewEvent:
    part, found = _text_part(hasher, context, redact, "/context")
    body: dict[str, Any] = {
        "room_id": room_id,
        "introducer": introducer,
        "peers": sorted(peers),
        "outgoing": outgoing,
        "context": part.digest,
    }
    if event_id:
        body["marker_event_id"] = event_id
    key = {"room_id": room_id}
    return _event("peers_introduced", session, key, body, (part,), found, redact=redact)


def message_sent(
    hasher: Hasher,
    session: str,
    *,
    event_id: str,
    room_id: str,
    recipient: str,
    text: str,
    txn_id: str,
    redact: bool = True,
    cut: Callable[[Mapping[str, Any]], tuple[dict[str, Any], list[dict[str, Any]]]] | None = None,
) -> NewEvent:
    """A message the homeserver accepted (``event_id`` is what it returned); ``cut`` (the
    archive's ``recall_echo_cut``) takes out the recalls it echoes, after redaction, and the
    body names them in ``echoes`` (FORMAT.md 13.4)."""
    value, found = _masked_text(text, redact, "/text")
    stored, echoes = cut({"text": value}) if cut is not None else ({"text": value}, [])
    part = hasher.part(stored["text"])
    body: dict[str, Any] = {
        "room_id": room_id,
        "recipient": recipient,
        "text": part.digest,
        "txn_id": txn_id,
    }
    if echoes:
        body["echoes"] = echoes
    key = {"event_id": event_id}
    return _event("peer_message_sent", session, key, body, (part,), found, redact=redact)


def send_failed(
    hasher: Hasher,
    session: str,
    *,
    txn_id: str,
    recipients: Sequence[str],
    text: str,
    error: str,
    retryable: bool,
    room_id: str | None = None,
    action: str = "send",
    redact: bool = True,
) -> NewEvent:
    """A send (or introduction) the homeserver did not acknowledge: nothing is marked sent."""
    part, found = _text_part(hasher, text, redact)
    body: dict[str, Any] = {
        "action": action,
        "recipients": list(recipients),
        "text": part.digest,
        "error": _text(error, MAX_ERROR_CHARS),
        "retryable": retryable,
    }
    if room_id:
        body["room_id"] = room_id
    key = {"txn_id": txn_id}
    return _event("peer_send_failed", session, key, body, (part,), found, redact=redact)


def messages_read(
    hasher: Hasher, session: str, event_ids: Iterable[str], *, redact: bool = True
) -> NewEvent:
    """The messages a ``hivemind_check_messages`` call returned, now read."""
    ids = sorted(set(event_ids))
    return _event(
        "peer_messages_read",
        session,
        {"messages": hasher.digest(canonical_bytes(ids))},
        {"messages": ids},
        redact=redact,
    )


def summary_updated(
    hasher: Hasher,
    *,
    peer: str,
    summary: str,
    covers: Sequence[str],
    method: str = "extractive",
    provider: str = "",
    model: str = "",
    prompt: Any = None,
    fallback: str = "",
    redact: bool = True,
) -> NewEvent:
    """A peer's summary of the messages ``covers`` names (oldest first), and what made it.

    ``method`` is ``llm`` (the host's auxiliary model; ``provider``/``model`` say which, and
    ``prompt`` is digested so an auditor can rebuild and compare it) or ``extractive``
    (``fallback`` says why no model wrote it, when one was meant to).
    """
    digest = hasher.digest(canonical_bytes(list(covers)))
    part, found = _text_part(hasher, summary, redact, "/summary")
    body: dict[str, Any] = {
        "peer": peer,
        "summary": part.digest,
        "covers": list(covers),
        "covers_digest": digest,
        "method": method,
    }
    if method == "llm":
        body["provider"] = _text(provider, MAX_NAME_CHARS) or "unknown"
        body["model"] = _text(model, MAX_NAME_CHARS) or "unknown"
    if prompt is not None:
        body["prompt_digest"] = hasher.digest(canonical_bytes(prompt))
    if fallback:
        body["fallback"] = _text(fallback, MAX_ERROR_CHARS)
    key = {"peer": peer, "covers": digest}
    return _event("peer_summary_updated", PEER_SESSION, key, body, (part,), found, redact=redact)


def spark_suggested(
    peer_a: str, peer_b: str, shared: Sequence[str], score: int, *, redact: bool = True
) -> NewEvent:
    a, b = pair_key(peer_a, peer_b)
    return _event(
        "spark_suggested",
        PEER_SESSION,
        {"pair": [a, b]},
        {"peer_a": a, "peer_b": b, "shared": list(shared), "score": score},
        redact=redact,
    )


def spark_dismissed(session: str, peer_a: str, peer_b: str, *, redact: bool = True) -> NewEvent:
    a, b = pair_key(peer_a, peer_b)
    body = {"peer_a": a, "peer_b": b}
    return _event("spark_dismissed", session, {"pair": [a, b]}, body, redact=redact)


def sync_position(
    next_batch: str,
    *,
    limited_rooms: Sequence[str] = (),
    left_rooms: Sequence[str] = (),
    unfilled_rooms: Sequence[str] = (),
    redact: bool = True,
) -> NewEvent:
    """Where the next sync resumes: every event of the syncs before it is in the log."""
    body: dict[str, Any] = {"next_batch": next_batch}
    if limited_rooms:
        body["limited_rooms"] = sorted(limited_rooms)  # a gap, backfilled from /messages
    if unfilled_rooms:
        body["unfilled_rooms"] = sorted(unfilled_rooms)  # backfill short: messages missing
    if left_rooms:
        body["left_rooms"] = sorted(left_rooms)
    key = {"next_batch": next_batch}
    return _event("peer_sync_position", PEER_SESSION, key, body, redact=redact)


def link_state(state: str, *, error: str = "", redact: bool = True) -> NewEvent:
    """The homeserver stopped answering (``offline``, with why) or answers again (``online``).

    Peer state in the projection is as of the last sync: while offline, the ``## Peers``
    block says it may be stale. One event per transition, keyed by the state and its time.
    """
    body: dict[str, Any] = {"state": state}
    if error:
        body["error"] = _text(error, MAX_ERROR_CHARS)
    key = {"state": state, "at": now_text()}
    return _event("peer_link_state", PEER_SESSION, key, body, redact=redact)


def witness_refused(
    peer: str, reason: str, evidence: str, offered: str, *, redact: bool = True
) -> NewEvent:
    """We refused to cosign ``peer``'s checkpoint: ``offered`` (its signed note) is not
    consistent with ``evidence``, the note of its log we cosigned before (both signed by its
    log key: the pair proves a rollback or a rewrite). Masked like every peer event, the
    notes' base64 excepted (:func:`_masked_note`)."""
    body = {"peer": peer, "reason": _text(reason, MAX_ERROR_CHARS)}
    found: list[dict[str, Any]] = []
    if redact:
        body, found = redact_value(body)
    notes = {"evidence": evidence, "offered": offered}
    for name, note in notes.items():
        masked, more = _masked_note(note, f"/{name}") if redact else (note, [])
        body = {**body, name: masked}
        found.extend(more)
    key = {"peer": peer, "offered": hashlib.sha256(offered.encode("utf-8")).hexdigest()}
    return NewEvent("peer_witness_refused", PEER_SESSION, key, with_redactions(body, found))


#: what a signed note's base64 decodes to: a root hash (32 bytes), a signature (key id and
#: 64 bytes) or a cosignature (key id, timestamp and 64 bytes)
_NOTE_HASH_BYTES, _NOTE_SIGNATURE_BYTES = 32, (68, 76)


def _decoded_length(text: str) -> int | None:
    try:
        return len(base64.b64decode(text.encode("ascii"), validate=True))
    except (binascii.Error, UnicodeEncodeError, ValueError):
        return None


def _masked_note(note: str, path: str) -> tuple[str, list[dict[str, Any]]]:
    """A signed note masked like any peer text, except its root hash and signatures: a mask
    that lands inside their base64 by chance (a vendor-token shape) made an honest note
    unverifiable. Text a peer slipped in (the origin, a key name, any other line) is still
    masked, and then the note no longer verifies, as it should not."""
    lines: list[str] = []
    found: list[dict[str, Any]] = []
    at = 0
    for line in note.split("\n"):
        head, space, tail = line.rpartition(" ")
        more: list[dict[str, Any]] = []
        if _decoded_length(line) == _NOTE_HASH_BYTES:
            masked = line
        elif line.startswith("— ") and space and _decoded_length(tail) in _NOTE_SIGNATURE_BYTES:
            masked_head, more = redact_value(head, path)
            masked = f"{masked_head} {tail}"
        else:
            masked, more = redact_value(line, path)
        found.extend({**r, "at": r["at"] + at} for r in more)
        lines.append(masked)
        at += len(masked) + 1
    return "\n".join(lines), found


def from_sync(hasher: Hasher, result: SyncResult, *, redact: bool = True) -> list[NewEvent]:
    """Every loggable fact of one sync result, in a fixed order (no position event)."""
    events: list[NewEvent] = []
    for m in result.members:
        events.append(
            member_seen(
                m.room_id, m.user_id, m.display_name, m.membership, m.event_id, redact=redact
            )
        )
    for p in result.profiles:
        events.append(
            profile_seen(
                p.room_id, p.user_id, p.event_id, p.origin_server_ts, p.profile, redact=redact
            )
        )
    for intro in result.introductions:
        events.append(
            introduction_seen(
                hasher,
                room_id=intro.room_id,
                introducer=intro.introducer,
                peers=intro.peers,
                event_id=intro.event_id,
                redact=redact,
            )
        )
    for invite in result.invites:
        if not invite.accepted:
            events.append(
                invite_ignored(
                    room_id=invite.room_id,
                    inviter=invite.inviter,
                    is_direct=invite.is_direct,
                    redact=redact,
                )
            )
    for u in result.undecryptable:
        events.append(
            message_undecryptable(
                event_id=u.event_id,
                room_id=u.room_id,
                sender=u.sender,
                origin_server_ts=u.origin_server_ts,
                session_id=u.session_id,
                redact=redact,
            )
        )
    for r in result.messages:
        events.append(
            message_received(
                hasher,
                event_id=r.event_id,
                room_id=r.room_id,
                sender=r.sender,
                text=r.body,
                origin_server_ts=r.origin_server_ts,
                encrypted=r.encrypted,
                redact=redact,
                msgtype=r.msgtype,
                backfilled=r.backfilled,
            )
        )
    for bad in result.rejected:
        events.append(
            input_rejected(
                hasher,
                room_id=bad.room_id,
                event_id=bad.event_id,
                sender=bad.sender,
                event_type=bad.event_type,
                reason=bad.reason,
                source=bad.source,
                backfilled=bad.backfilled,
            )
        )
    return events
