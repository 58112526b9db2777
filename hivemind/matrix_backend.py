"""Matrix transport for hivemind: matrix-nio with end-to-end encryption on its own loop thread.

The host calls a memory provider synchronously, from whatever thread it likes; matrix-nio is
asyncio. One private event loop, in one dedicated thread, owns the nio client. Every public
method hands a coroutine to that loop and waits for it with a bound, so a caller never blocks
forever on a dead homeserver and nio state is never touched from two loops.

What the backend reports is plain data (frozen dataclasses, no nio objects), so the provider
can turn it into log events without knowing Matrix.

Trust model: devices are not verified. Agents have no human at hand to compare emoji, so
messages are sent with ``ignore_unverified_devices=True``: every current device of every room
member receives the room key. Encryption keeps message text off the homeserver's disk and away
from its operators, but it does not prove which device speaks for a user (a compromised
homeserver could add one). hivemind treats everything a peer says as untrusted data anyway.
Profiles and introduction markers are room *state*, which Matrix never encrypts: they are
visible to the homeserver.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import inspect
import json
import logging
import threading
import time
from collections.abc import Callable, Collection, Coroutine, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, TypeVar

import aiohttp
from jsonschema import ValidationError
from nio import (
    AsyncClient,
    AsyncClientConfig,
    BadEvent,
    ErrorResponse,
    InviteMemberEvent,
    JoinResponse,
    KeysQueryResponse,
    KeysUploadResponse,
    LocalProtocolError,
    LoginResponse,
    MegolmEvent,
    RoomCreateResponse,
    RoomMemberEvent,
    RoomMessage,
    RoomMessageNotice,
    RoomMessagesResponse,
    RoomMessageText,
    RoomPreset,
    RoomPutStateResponse,
    RoomSendResponse,
    SyncResponse,
    UnknownBadEvent,
    WhoamiResponse,
)
from nio import crypto as nio_crypto
from nio.schemas import Schemas, validate_json

from archive_provider import INT_MAX, ArchiveError, spawn_thread

logger = logging.getLogger(__name__)

PROFILE_EVENT_TYPE = "org.hermes_archive.hivemind.profile"
INTRODUCTION_EVENT_TYPE = "org.hermes_archive.hivemind.introduction"
#: peers witnessing each other: a room message of this msgtype carries the exchange in
#: ``content[WITNESS_MSGTYPE]`` (encrypted like any message; never shown as peer text)
WITNESS_MSGTYPE = "org.hermes_archive.witness"
MEGOLM_ALGORITHM = "m.megolm.v1.aes-sha2"
MAX_PROFILE_BYTES = 32 * 1024  # well under Matrix's 64 KiB event limit
BACKFILL_PAGE = 100  # events per /messages request when a sync left a gap
BACKFILL_PAGES = 10  # at most this many requests per gap; beyond, the room is "unfilled"

_ENCRYPTION_STATE = {
    "type": "m.room.encryption",
    "state_key": "",
    "content": {"algorithm": MEGOLM_ALGORITHM},
}
# Every member may publish its own profile (receivers check state_key == sender).
_POWER_LEVELS = {"events": {PROFILE_EVENT_TYPE: 0}}

T = TypeVar("T")
ThreadFactory = Callable[[Callable[[], None], str], threading.Thread]


class MatrixError(ArchiveError):
    """A Matrix operation failed; ``room_id`` names the room it concerned, if any."""

    def __init__(self, message: str, *, room_id: str | None = None) -> None:
        super().__init__(message)
        self.room_id = room_id


class MatrixUnavailable(MatrixError):
    """The homeserver did not answer in time, could not be reached, or failed (5xx/429).

    Retrying later may succeed; nothing is known to have reached the server.
    """


class MatrixRequestError(MatrixError):
    """The homeserver refused the request (4xx): retrying the same request will not help."""

    def __init__(
        self, message: str, *, errcode: str | None, http_status: int, room_id: str | None = None
    ) -> None:
        super().__init__(message, room_id=room_id)
        self.errcode = errcode
        self.http_status = http_status


@dataclass(frozen=True)
class MatrixSession:
    """What a restart needs to come back as the same device. Keep it secret."""

    user_id: str
    device_id: str
    access_token: str = field(repr=False)


@dataclass(frozen=True)
class ReceivedMessage:
    """A message from another user; ``event_id`` is its identity.

    Text and notices carry their body; any other message (an emote, a file, a msgtype
    hivemind does not know) is kept too, with its ``msgtype`` and its body text if any.
    """

    event_id: str
    room_id: str
    sender: str
    body: str
    origin_server_ts: int
    encrypted: bool
    msgtype: str = "m.text"
    backfilled: bool = False  # fetched from /messages after a gap, not from the sync timeline


@dataclass(frozen=True)
class WitnessMessage:
    """A witness exchange from a peer (a checkpoint to cosign, or an answer to ours)."""

    event_id: str
    room_id: str
    sender: str
    origin_server_ts: int
    payload: Mapping[str, Any] = field(hash=False, compare=False)


@dataclass(frozen=True)
class RejectedEvent:
    """An event matrix-nio could not parse (``BadEvent``/``UnknownBadEvent``): rejected peer
    input, kept with the reason. ``event_id``/``sender`` are empty when the event lacked them."""

    room_id: str
    event_id: str
    sender: str
    event_type: str
    reason: str
    source: Mapping[str, Any] = field(hash=False, compare=False)
    backfilled: bool = False


@dataclass(frozen=True)
class UndecryptableMessage:
    """An encrypted event whose room key this device never received."""

    event_id: str
    room_id: str
    sender: str
    origin_server_ts: int
    session_id: str


@dataclass(frozen=True)
class InviteSeen:
    """An invite and what the policy decided; accepted invites are joined by the backend.

    Invites carry stripped state without event ids: (room_id, inviter) identifies one.
    """

    room_id: str
    inviter: str
    is_direct: bool
    accepted: bool


@dataclass(frozen=True)
class MemberSeen:
    """A membership event of another user (``join``, ``invite``, ``leave``, ``ban``)."""

    room_id: str
    user_id: str
    display_name: str | None
    membership: str
    event_id: str


@dataclass(frozen=True)
class ProfileSeen:
    """A peer's self-published profile state event (read-only view of its content)."""

    room_id: str
    user_id: str
    event_id: str
    origin_server_ts: int
    profile: Mapping[str, Any] = field(hash=False)


@dataclass(frozen=True)
class IntroductionSeen:
    """An introduction room marker; ``introducer`` is the sender, never the claimed content."""

    room_id: str
    introducer: str
    peers: tuple[str, ...]
    event_id: str
    origin_server_ts: int


@dataclass(frozen=True)
class SyncResult:
    """Everything seen since the previous ``sync()`` (including syncs run internally).

    ``limited_rooms`` had more new events than the timeline limit: the backend backfilled
    the gap from ``/messages`` (those messages say ``backfilled``) before returning, except
    in ``unfilled_rooms``, where the backfill stopped short (too long, or it failed) and
    messages may be missing. ``left_rooms`` are rooms we left or were removed from. After a restart, state
    (members, profiles, introductions, pending invites) is
    reported again in full; messages are not.
    """

    next_batch: str
    messages: tuple[ReceivedMessage, ...] = ()
    undecryptable: tuple[UndecryptableMessage, ...] = ()
    invites: tuple[InviteSeen, ...] = ()
    members: tuple[MemberSeen, ...] = ()
    profiles: tuple[ProfileSeen, ...] = ()
    introductions: tuple[IntroductionSeen, ...] = ()
    limited_rooms: tuple[str, ...] = ()
    left_rooms: tuple[str, ...] = ()
    rejected: tuple[RejectedEvent, ...] = ()
    unfilled_rooms: tuple[str, ...] = ()
    witness: tuple[WitnessMessage, ...] = ()


@dataclass
class _Pending:
    """What internal syncs collected that the next public ``sync()`` has not returned yet."""

    messages: list[ReceivedMessage] = field(default_factory=list)
    undecryptable: list[UndecryptableMessage] = field(default_factory=list)
    invites: list[InviteSeen] = field(default_factory=list)
    members: list[MemberSeen] = field(default_factory=list)
    profiles: list[ProfileSeen] = field(default_factory=list)
    introductions: list[IntroductionSeen] = field(default_factory=list)
    limited_rooms: list[str] = field(default_factory=list)
    left_rooms: list[str] = field(default_factory=list)
    rejected: list[RejectedEvent] = field(default_factory=list)
    unfilled_rooms: list[str] = field(default_factory=list)
    witness: list[WitnessMessage] = field(default_factory=list)

    def result(self, next_batch: str) -> SyncResult:
        def unique(items: list[Any]) -> tuple[Any, ...]:
            return tuple(dict.fromkeys(items))

        return SyncResult(
            next_batch=next_batch,
            messages=unique(self.messages),
            undecryptable=unique(self.undecryptable),
            invites=unique(self.invites),
            members=unique(self.members),
            profiles=unique(self.profiles),
            introductions=unique(self.introductions),
            limited_rooms=unique(self.limited_rooms),
            left_rooms=unique(self.left_rooms),
            rejected=unique(self.rejected),
            unfilled_rooms=unique(self.unfilled_rooms),
            witness=unique(self.witness),
        )


def server_name(user_id: str) -> str | None:
    """The server part of ``@local:server``, or None if ``user_id`` is not a user id."""
    if not isinstance(user_id, str) or not user_id.startswith("@"):
        return None
    local, sep, server = user_id[1:].partition(":")
    if not sep or not local or not server:
        return None
    return server


def invite_allowed(
    inviter: str,
    allow_users: Collection[str],
    allow_servers: Collection[str] | None,
    own_server: str,
) -> bool:
    """Decide whether to join a room ``inviter`` invited us to.

    Joining is what lets someone put text in front of the agent, so the default is narrow:
    users of our own homeserver (``allow_servers=None``). An explicit ``allow_servers``
    replaces that default (pass ``()`` to allow only ``allow_users``).
    """
    server = server_name(inviter)
    if server is None:
        return False
    if inviter in allow_users:
        return True
    servers = {own_server} if allow_servers is None else set(allow_servers)
    return server.casefold() in {s.casefold() for s in servers}


# nio's store binds its *global* peewee model classes to one store's database for the length
# of each call (``bind_ctx``) and restores the previous binding afterwards. Two clients on two
# loop threads therefore race: one store's rows land in the other's database, or a query finds
# no database at all. Every store call in the process holds this lock.
_NIO_STORE_LOCK = threading.RLock()


def _serialized(method: Callable[..., T]) -> Callable[..., T]:
    @functools.wraps(method)
    def locked(*args: Any, **kwargs: Any) -> T:
        with _NIO_STORE_LOCK:
            return method(*args, **kwargs)

    return locked


@functools.cache
def serialized_store() -> type:
    """nio's DefaultStore with every method (construction included) under one process lock."""
    from nio.store import DefaultStore

    methods = {
        name: _serialized(member)
        for name, member in inspect.getmembers(DefaultStore, inspect.isfunction)
        if not name.startswith("__") or name in ("__init__", "__post_init__")
    }
    return type("SerializedStore", (DefaultStore,), methods)


def context_thread(target: Callable[[], None], name: str) -> threading.Thread:
    """The default ``(target, name)`` thread factory: the host's context threads, through
    ``archive_provider.spawn_thread`` (its own fallback copies the caller's contextvars)."""
    return spawn_thread(target, name=name)


def _digest(
    response: SyncResponse,
    own_user_id: str,
    into: _Pending,
    backfills: Mapping[str, list[Any]] = MappingProxyType({}),
) -> None:
    """Turn the hivemind-relevant parts of a processed sync response into plain records.

    ``backfills`` holds, per room, what ``/messages`` returned for the gap before its
    timeline (oldest first): it is digested before that room's timeline, marked backfilled.
    """
    for room_id, info in response.rooms.join.items():
        if info.timeline.limited:
            into.limited_rooms.append(room_id)
        for event in info.state:
            _digest_event(event, room_id, own_user_id, into)
        for event in backfills.get(room_id, ()):
            _digest_event(event, room_id, own_user_id, into, backfilled=True)
        for event in info.timeline.events:
            _digest_event(event, room_id, own_user_id, into)
    into.left_rooms.extend(response.rooms.leave)


def _witness_payload(event: Any) -> Mapping[str, Any] | None:
    """The witness exchange a room message carries, if it is one (an object, else None)."""
    content = event.source.get("content")
    if not isinstance(content, dict) or content.get("msgtype") != WITNESS_MSGTYPE:
        return None
    payload = content.get(WITNESS_MSGTYPE)
    return payload if isinstance(payload, dict) else None


def _digest_event(
    event: Any, room_id: str, own_user_id: str, into: _Pending, *, backfilled: bool = False
) -> None:
    sender = getattr(event, "sender", None)
    if isinstance(event, RoomMemberEvent):
        name = event.content.get("displayname")
        if event.state_key != own_user_id:
            into.members.append(
                MemberSeen(
                    room_id,
                    event.state_key,
                    name if isinstance(name, str) else None,
                    event.membership,
                    event.event_id,
                )
            )
    elif sender == own_user_id:
        return
    elif isinstance(event, (BadEvent, UnknownBadEvent)):
        into.rejected.append(_rejected(event, room_id, backfilled))
    elif isinstance(event, RoomMessage) and _witness_payload(event) is not None:
        into.witness.append(
            WitnessMessage(
                event.event_id,
                room_id,
                event.sender,
                _timestamp(event.server_timestamp),
                _witness_payload(event) or {},
            )
        )
    elif isinstance(event, (RoomMessageText, RoomMessageNotice)):
        into.messages.append(
            ReceivedMessage(
                event.event_id,
                room_id,
                event.sender,
                event.body,
                _timestamp(event.server_timestamp),
                bool(event.decrypted),
                backfilled=backfilled,
            )
        )
    elif isinstance(event, RoomMessage):
        content = event.source.get("content")
        content = content if isinstance(content, dict) else {}
        body, msgtype = content.get("body"), content.get("msgtype")
        into.messages.append(
            ReceivedMessage(
                event.event_id,
                room_id,
                event.sender,
                body if isinstance(body, str) else "",
                _timestamp(event.server_timestamp),
                bool(event.decrypted),
                msgtype if isinstance(msgtype, str) else "",
                backfilled=backfilled,
            )
        )
    elif isinstance(event, MegolmEvent):
        into.undecryptable.append(
            UndecryptableMessage(
                event.event_id,
                room_id,
                event.sender,
                _timestamp(event.server_timestamp),
                event.session_id,
            )
        )
    else:
        _digest_custom_state(event, room_id, into)


def _rejected(event: BadEvent | UnknownBadEvent, room_id: str, backfilled: bool) -> RejectedEvent:
    source = event.source if isinstance(event.source, dict) else {}

    def text(key: str) -> str:
        value = source.get(key)
        return value if isinstance(value, str) else ""

    return RejectedEvent(
        room_id,
        text("event_id"),
        text("sender"),
        text("type"),
        rejection_reason(source, known_shape=isinstance(event, BadEvent)),
        MappingProxyType(dict(source)),
        backfilled,
    )


def rejection_reason(source: Mapping[str, Any], *, known_shape: bool) -> str:
    """Why matrix-nio rejected ``source``: the first schema violation nio's own schemas find."""
    if not known_shape:
        return "not an event: event_id, sender, origin_server_ts or type is missing or malformed"
    kind = source.get("type")
    content = source.get("content")
    msgtype = content.get("msgtype") if isinstance(content, dict) else None
    names = [str(kind).removeprefix("m.").replace(".", "_")]
    if kind == "m.room.message" and isinstance(msgtype, str):
        names.insert(0, "room_message_" + msgtype.removeprefix("m."))
    for name in (*names, "room_event"):
        schema = getattr(Schemas, name, None)
        if not isinstance(schema, dict):
            continue
        try:
            validate_json(dict(source), schema)
        except ValidationError as exc:
            where = "/".join(str(p) for p in exc.absolute_path) or "the event"
            return f"{kind}: {where}: {exc.message}"[:500]
    return f"{kind}: matrix-nio's schema for this event type rejected it"


def _timestamp(value: Any) -> int:
    """A server timestamp the log can hold (a signed 64-bit integer); 0 when it is not one.

    nio checks only that it is a non-negative integer, so a peer's server can send 2**70,
    which would fail the whole sync's job at canonical encoding.
    """
    return value if type(value) is int and 0 <= value <= INT_MAX else 0


def _digest_custom_state(event: Any, room_id: str, into: _Pending) -> None:
    source = getattr(event, "source", None)
    if not isinstance(source, dict) or "state_key" not in source:
        return
    content = source.get("content")
    sender = source.get("sender")
    if not isinstance(content, dict) or not isinstance(sender, str):
        return
    kind, state_key, event_id = source.get("type"), source["state_key"], source.get("event_id")
    if not (isinstance(state_key, str) and isinstance(event_id, str) and event_id):
        logger.warning(
            "hivemind: ignoring a %s state event without a usable id in %s", kind, room_id
        )
        return
    ts = _timestamp(source.get("origin_server_ts"))
    if kind == PROFILE_EVENT_TYPE and state_key == sender and content:
        into.profiles.append(
            ProfileSeen(room_id, sender, event_id, ts, MappingProxyType(dict(content)))
        )
    elif kind == INTRODUCTION_EVENT_TYPE and state_key == "":
        peers = content.get("peers")
        if isinstance(peers, list) and all(server_name(p) for p in peers):
            into.introductions.append(
                IntroductionSeen(room_id, sender, tuple(sorted(peers)), event_id, ts)
            )


def direct_room_choice(rooms: Mapping[str, Any], own: str, peer: str) -> str | None:
    """The one direct room both sides of a pair pick, or None if there is none yet.

    Two agents that open a conversation at the same moment each create a room; once each
    has joined the other's, both must send to the same one. Among encrypted rooms whose
    members are exactly the pair, the smallest room id where both have joined wins; a room
    where one side is still only invited (its invite may never be accepted) is used only
    when there is no joined one.
    """
    pair = {own, peer}
    candidates = [r for r, room in rooms.items() if room.encrypted and set(room.users) == pair]
    joined = [r for r in candidates if not pair & set(rooms[r].invited_users)]
    return min(joined or candidates, default=None)


def _invites(response: SyncResponse, own_user_id: str) -> Iterable[tuple[str, str, bool]]:
    """(room_id, inviter, is_direct) for each invite addressed to us in this sync."""
    for room_id, info in response.rooms.invite.items():
        for event in info.invite_state:
            if (
                isinstance(event, InviteMemberEvent)
                and event.state_key == own_user_id
                and event.membership == "invite"
            ):
                yield room_id, event.sender, bool(event.content.get("is_direct"))
                break


class MatrixBackend:
    """One agent's Matrix account, driven from synchronous code through a private loop thread.

    Lifecycle: construct, ``start()``, use, ``close()``. A backend is not restartable: build a
    new one on the same ``store_dir`` (it resumes the device, its keys and the sync token).
    Every public method is thread-safe and bounded by ``timeout``; the defaults are
    ``op_timeout`` for single requests, twice that for room set-ups (create or join, then wait
    for sync to show the room), three times for ``start()``, and ``timeout_ms`` plus
    ``op_timeout`` for ``sync()``. Run one poller at a time: syncs are serialised.
    """

    def __init__(
        self,
        homeserver: str,
        user_id: str,
        store_dir: str | Path,
        *,
        access_token: str | None = None,
        device_id: str | None = None,
        password: str | None = None,
        device_name: str = "hermes-hivemind",
        allow_users: Iterable[str] = (),
        allow_servers: Iterable[str] | None = None,
        thread_factory: ThreadFactory = context_thread,
        op_timeout: float = 20.0,
        timeline_limit: int = 100,
    ) -> None:
        own_server = server_name(user_id)
        if own_server is None:
            raise ValueError(f"not a Matrix user id: {user_id!r}")
        if (access_token is None) == (password is None):
            raise ValueError("pass exactly one of access_token (restore) or password (login)")
        self.homeserver = homeserver.rstrip("/")
        self.user_id = user_id
        self.store_dir = Path(store_dir)
        self._own_server = own_server
        self._access_token = access_token
        self._password = password
        self._secrets = [s for s in (access_token, password) if s]
        self._device_id = device_id
        self._device_name = device_name
        self._allow_users = frozenset(allow_users)
        self._allow_servers = None if allow_servers is None else frozenset(allow_servers)
        self._thread_factory = thread_factory
        self._op_timeout = op_timeout
        self._sync_filter = {"room": {"timeline": {"limit": timeline_limit}}}
        self._lifecycle = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._closed = False
        # Loop-thread state, touched only by coroutines running on self._loop.
        self._client: AsyncClient | None = None
        self._pending = _Pending()
        self._to_join: dict[str, str] = {}
        self._sync_lock: asyncio.Lock | None = None
        self._send_lock: asyncio.Lock | None = None
        self._room_lock: asyncio.Lock | None = None

    def __repr__(self) -> str:
        state = "closed" if self._closed else "running" if self._loop else "new"
        return (
            f"MatrixBackend(user_id={self.user_id!r}, device_id={self._device_id!r}, "
            f"homeserver={self.homeserver!r}, {state})"
        )

    @property
    def session(self) -> MatrixSession | None:
        """The logged-in device (after ``start()``), to persist for the next restore."""
        if self._access_token is None or self._device_id is None:
            return None
        return MatrixSession(self.user_id, self._device_id, self._access_token)

    # -- synchronous, thread-safe API ------------------------------------------------------

    def start(self, timeout: float | None = None, *, since: str | None = None) -> None:
        """Log in (or restore the stored device), upload keys if needed, run the first sync.

        What the first sync saw is returned by the next ``sync()``. ``since`` resumes from a
        sync token the caller recorded (its own log) instead of the one nio stored, which nio
        saves *before* the caller has handled that sync: resuming from the caller's token
        redelivers whatever it never recorded (at-least-once; callers dedupe by event id).
        """
        with self._lifecycle:
            if self._loop is not None or self._closed:
                raise RuntimeError("a MatrixBackend can be started only once")
            loop = asyncio.new_event_loop()
            name = f"hivemind-matrix-{self.user_id[1:].partition(':')[0]}"
            try:
                thread = self._thread_factory(functools.partial(self._run_loop, loop), name)
                thread.start()
            except BaseException:
                loop.close()
                raise
            self._loop, self._thread = loop, thread
        try:
            self._call("start", self._start(since), timeout or 3 * self._op_timeout)
        except BaseException:
            self.close()
            raise

    def sync(self, timeout_ms: int = 0, *, timeout: float | None = None) -> SyncResult:
        """Long-poll up to ``timeout_ms`` for news; returns everything not yet returned."""
        if timeout_ms < 0:
            raise ValueError("timeout_ms must be >= 0")
        bound = timeout if timeout is not None else timeout_ms / 1000 + self._op_timeout
        return self._call("sync", self._sync_and_drain(timeout_ms), bound)

    def send_text(
        self, room_id: str, text: str, *, txn_id: str | None = None, timeout: float | None = None
    ) -> str:
        """Send ``text`` and return its event id once the homeserver has accepted it.

        Encrypted rooms get Megolm, shared with all members' devices, verified or not (see the
        module docstring). A retry with the same ``txn_id`` is deduplicated by the server.
        """
        if not text:
            raise ValueError("refusing to send an empty message")
        content = {"msgtype": "m.text", "body": text}
        return self._call("send", self._send(room_id, content, txn_id), timeout, room_id)

    def send_witness(
        self, room_id: str, payload: Mapping[str, Any], *, timeout: float | None = None
    ) -> str:
        """Send a witness exchange (:data:`WITNESS_MSGTYPE`) as an encrypted room message."""
        content = {
            "msgtype": WITNESS_MSGTYPE,
            "body": "hermes-archive witness exchange",
            WITNESS_MSGTYPE: json.loads(json.dumps(dict(payload), allow_nan=False)),
        }
        return self._call("send", self._send(room_id, content, None), timeout, room_id)

    def direct_room_for(self, user_id: str, *, timeout: float | None = None) -> str:
        """The encrypted room with just us and ``user_id``; created (and invited) if missing."""
        self._check_peer(user_id)
        return self._call("direct room", self._direct_room(user_id), timeout or self._room_bound)

    def create_introduction_room(
        self, user_a: str, user_b: str, text: str, *, timeout: float | None = None
    ) -> str:
        """Create an encrypted room, invite both peers and post the introduction ``text``.

        If posting fails after the room exists, the error's ``room_id`` names that room.
        """
        self._check_peer(user_a)
        self._check_peer(user_b)
        if user_a == user_b:
            raise ValueError("cannot introduce a peer to itself")
        if not text:
            raise ValueError("an introduction needs a text")
        return self._call(
            "introduce", self._introduce(user_a, user_b, text), timeout or self._room_bound
        )

    def joined_rooms(self, *, timeout: float | None = None) -> tuple[str, ...]:
        """The rooms this device has joined, as of the last sync (sorted)."""
        return self._call("joined rooms", self._joined_rooms(), timeout)

    def join(self, room_id: str, *, timeout: float | None = None) -> None:
        """Join ``room_id`` (bypassing the invite policy) and wait until sync knows the room."""
        self._call("join", self._join(room_id), timeout or self._room_bound, room_id)

    def publish_profile(
        self, room_id: str, profile: Mapping[str, Any], *, timeout: float | None = None
    ) -> str:
        """Publish our profile in ``room_id`` as a state event keyed by our user id.

        State is not encrypted: put nothing in a profile that the homeserver must not see.
        """
        encoded = json.dumps(dict(profile), allow_nan=False)
        content = json.loads(encoded)  # a detached, JSON-clean copy
        if len(encoded.encode()) > MAX_PROFILE_BYTES:
            raise ValueError(f"profile larger than {MAX_PROFILE_BYTES} bytes")
        return self._call(
            "publish profile", self._publish_profile(room_id, content), timeout, room_id
        )

    def close(self, timeout: float = 5.0) -> None:
        """Close the HTTP session and stop the loop thread, waiting at most ``timeout``."""
        with self._lifecycle:
            loop, thread = self._loop, self._thread
            already = self._closed
            self._closed = True
        if already or loop is None or thread is None:
            return
        if thread is threading.current_thread():
            raise RuntimeError("close() called from the Matrix loop thread")
        deadline = time.monotonic() + timeout
        future = asyncio.run_coroutine_threadsafe(self._shutdown(), loop)
        try:
            future.result(max(0.0, deadline - time.monotonic()))
        except Exception as exc:  # closing must not raise; say what happened
            future.cancel()
            logger.warning("hivemind: closing the Matrix client failed (%s)", type(exc).__name__)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(max(0.0, deadline - time.monotonic()))
        if thread.is_alive():
            logger.warning("hivemind: Matrix loop thread still running after %.1f s", timeout)

    # -- plumbing ----------------------------------------------------------------------------

    @property
    def _room_bound(self) -> float:
        """Room set-ups send and then wait (up to op_timeout) for sync to show the room."""
        return 2 * self._op_timeout

    def _check_peer(self, user_id: str) -> None:
        if server_name(user_id) is None:
            raise ValueError(f"not a Matrix user id: {user_id!r}")
        if user_id == self.user_id:
            raise ValueError("that is our own user id")

    def _redact(self, text: str) -> str:
        for secret in self._secrets:
            text = text.replace(secret, "<redacted>")
        return text

    def _call(
        self,
        what: str,
        coro: Coroutine[Any, Any, T],
        timeout: float | None,
        room_id: str | None = None,
    ) -> T:
        """Run ``coro`` on the loop thread and wait at most ``timeout`` seconds for it."""
        bound = self._op_timeout if timeout is None else timeout
        with self._lifecycle:
            loop, closed = self._loop, self._closed
        if loop is None or closed:
            coro.close()
            raise MatrixUnavailable(f"{what}: the Matrix backend is not running", room_id=room_id)
        if threading.current_thread() is self._thread:
            coro.close()
            raise RuntimeError(f"{what}: called from the Matrix loop thread (would deadlock)")
        future = asyncio.run_coroutine_threadsafe(self._translated(what, coro, room_id), loop)
        try:
            return future.result(bound)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise MatrixUnavailable(
                f"{what}: no answer from {self.homeserver} within {bound:g} s", room_id=room_id
            ) from None
        except concurrent.futures.CancelledError:
            raise MatrixUnavailable(
                f"{what}: the Matrix backend was closed", room_id=room_id
            ) from None

    async def _translated(
        self, what: str, coro: Coroutine[Any, Any, T], room_id: str | None = None
    ) -> T:
        """Map transport and nio failures to MatrixError, with secrets scrubbed."""
        try:
            return await coro
        except MatrixError as exc:
            exc.room_id = exc.room_id or room_id
            raise
        except (aiohttp.ClientError, OSError, asyncio.TimeoutError) as exc:
            detail = self._redact(f"{type(exc).__name__}: {exc}")
            raise MatrixUnavailable(
                f"{what}: cannot reach {self.homeserver} ({detail})", room_id=room_id
            ) from None
        except LocalProtocolError as exc:
            raise MatrixError(self._redact(f"{what}: {exc}"), room_id=room_id) from None

    def _failure(self, what: str, response: Any, room_id: str | None = None) -> MatrixError:
        """The exception for an unexpected nio response (ErrorResponse or otherwise)."""
        transport = getattr(response, "transport_response", None)
        status = getattr(transport, "status", None)
        text = self._redact(f"{what}: {response}")
        if not isinstance(response, ErrorResponse):
            return MatrixError(text, room_id=room_id)
        if status is None or status >= 500 or status == 429:
            return MatrixUnavailable(text, room_id=room_id)
        return MatrixRequestError(
            text, errcode=response.status_code, http_status=status, room_id=room_id
        )

    @staticmethod
    def _run_loop(loop: asyncio.AbstractEventLoop) -> None:
        asyncio.set_event_loop(loop)
        try:
            loop.run_forever()
        finally:
            try:
                tasks = asyncio.all_tasks(loop)
                for task in tasks:
                    task.cancel()
                loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
                loop.run_until_complete(loop.shutdown_asyncgens())
            finally:
                asyncio.set_event_loop(None)
                loop.close()

    # -- coroutines (loop thread only) -------------------------------------------------------

    @property
    def _nio(self) -> AsyncClient:
        assert self._client is not None, "not started"
        return self._client

    async def _start(self, since: str | None) -> None:
        if not nio_crypto.ENCRYPTION_ENABLED:
            raise MatrixError("matrix-nio has no E2EE support: install matrix-nio[e2e]")
        self._sync_lock, self._send_lock = asyncio.Lock(), asyncio.Lock()
        self._room_lock = asyncio.Lock()
        self.store_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        config = AsyncClientConfig(
            encryption_enabled=True,
            store_sync_tokens=True,
            max_timeouts=1,  # fail over to MatrixUnavailable instead of retrying forever
            max_timeout_retry_wait_time=1.0,
            request_timeout=self._op_timeout,
            store=serialized_store(),
        )
        client = AsyncClient(
            self.homeserver, self.user_id, store_path=str(self.store_dir), config=config
        )
        self._client = client
        if self._password is not None:
            login = await client.login(self._password, device_name=self._device_name)
            if not isinstance(login, LoginResponse):
                raise self._failure("login", login)
            self._password = None
            self._access_token = login.access_token
            self._secrets.append(login.access_token)
        else:
            assert self._access_token is not None
            client.access_token = self._access_token
            whoami = await client.whoami()
            if not isinstance(whoami, WhoamiResponse):
                raise self._failure("whoami", whoami)
            if whoami.user_id != self.user_id:
                raise MatrixError(
                    f"the access token belongs to {whoami.user_id}, not {self.user_id}"
                )
            if self._device_id and whoami.device_id and whoami.device_id != self._device_id:
                raise MatrixError(
                    f"the access token belongs to device {whoami.device_id}, not {self._device_id}"
                )
            device_id = self._device_id or whoami.device_id
            if not device_id:
                raise MatrixError("cannot tell this access token's device id: pass device_id")
            client.restore_login(self.user_id, device_id, self._access_token)
        self._device_id = client.device_id
        await self._maintain_keys()
        await self._sync_once(0, full_state=True, since=since)

    async def _maintain_keys(self) -> None:
        client = self._nio
        if client.should_upload_keys:
            uploaded = await client.keys_upload()
            if not isinstance(uploaded, KeysUploadResponse):
                raise self._failure("keys upload", uploaded)
        if client.should_query_keys:
            queried = await client.keys_query()
            if not isinstance(queried, KeysQueryResponse):
                raise self._failure("keys query", queried)

    async def _sync_once(
        self, timeout_ms: int, full_state: bool = False, since: str | None = None
    ) -> None:
        """One sync round; its news goes to the pending buffer before anything else awaits.

        ``since`` is passed to nio's ``sync`` rather than set as ``client.next_batch``: nio
        skips a response whose token equals ``next_batch``, and a full-state resync with
        nothing new would then leave the client without its rooms.
        """
        assert self._sync_lock is not None
        async with self._sync_lock:
            client = self._nio
            previous = since or client.next_batch
            response = await client.sync(
                timeout=timeout_ms,
                sync_filter=self._sync_filter,
                since=since or None,
                full_state=full_state or None,
            )
            if not isinstance(response, SyncResponse):
                raise self._failure("sync", response)
            backfills: dict[str, list[Any]] = {}
            if previous:  # a gap since our last position, not a first sync's short history
                for room_id, info in response.rooms.join.items():
                    if info.timeline.limited and info.timeline.prev_batch:
                        backfills[room_id] = await self._backfill(
                            room_id, info.timeline.prev_batch, previous
                        )
            _digest(response, self.user_id, self._pending, backfills)
            for room_id in response.rooms.leave:  # nio 0.26 ignores left rooms: forget them
                client.rooms.pop(room_id, None)
                client.invited_rooms.pop(room_id, None)
                self._to_join.pop(room_id, None)
            for room_id, inviter, is_direct in _invites(response, self.user_id):
                accepted = invite_allowed(
                    inviter, self._allow_users, self._allow_servers, self._own_server
                )
                self._pending.invites.append(InviteSeen(room_id, inviter, is_direct, accepted))
                if accepted:
                    self._to_join[room_id] = inviter
                else:
                    logger.info(
                        "hivemind: ignoring invite to %s from %s (invite policy)", room_id, inviter
                    )
            await self._maintain_keys()
            await self._join_invited()

    async def _backfill(self, room_id: str, prev_batch: str, since: str) -> list[Any]:
        """The events of a timeline gap, oldest first, from room ``/messages``.

        Pages back from the gap's ``prev_batch`` to our previous sync position; a gap longer
        than ``BACKFILL_PAGES`` pages, or a request that fails, leaves the room "unfilled"
        (recorded, so the log says messages there may be missing) with what was fetched.
        """
        fetched: list[Any] = []
        token = prev_batch
        for _ in range(BACKFILL_PAGES):
            try:
                page = await self._nio.room_messages(
                    room_id, start=token, end=since, limit=BACKFILL_PAGE
                )
            except (aiohttp.ClientError, OSError, asyncio.TimeoutError) as exc:
                page = exc
            if not isinstance(page, RoomMessagesResponse):
                logger.warning(
                    "hivemind: backfilling %s failed: %s", room_id, self._redact(str(page))
                )
                break
            fetched.extend(page.chunk)
            if not page.chunk or not page.end or page.end == token:
                return fetched[::-1]
            token = page.end
        self._pending.unfilled_rooms.append(room_id)
        return fetched[::-1]

    async def _join_invited(self) -> None:
        """Join accepted invites; transient failures are retried on the next sync."""
        for room_id in list(self._to_join):
            joined = await self._nio.join(room_id)
            if isinstance(joined, JoinResponse):
                del self._to_join[room_id]
                continue
            error = self._failure("join", joined, room_id)
            if not isinstance(error, MatrixUnavailable):
                del self._to_join[room_id]  # e.g. the invite was withdrawn
            logger.warning("hivemind: %s", error)

    async def _sync_and_drain(self, timeout_ms: int) -> SyncResult:
        await self._sync_once(timeout_ms)
        pending, self._pending = self._pending, _Pending()
        return pending.result(self._nio.next_batch)

    async def _await_room(self, room_id: str, members: Collection[str]) -> None:
        """Sync until the room and the given members (joined or invited) are known locally."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._op_timeout
        while True:
            room = self._nio.rooms.get(room_id)
            if room is not None and set(members) <= set(room.users):
                return
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise MatrixUnavailable(f"room {room_id} did not show up in sync", room_id=room_id)
            await self._sync_once(int(min(remaining, 1.0) * 1000))

    async def _send(self, room_id: str, content: dict[str, Any], txn_id: str | None) -> str:
        assert self._send_lock is not None
        async with self._send_lock:  # serialised: nio's group-session sharing is not reentrant
            client = self._nio
            if room_id not in client.rooms:
                raise MatrixError(f"send: not a member of {room_id}", room_id=room_id)
            try:
                sent = await client.room_send(
                    room_id, "m.room.message", content, tx_id=txn_id, ignore_unverified_devices=True
                )
            except BaseException:
                self._reset_group_session(room_id)
                raise
            if not isinstance(sent, RoomSendResponse):
                self._reset_group_session(room_id)
                raise self._failure("send", sent, room_id)
            return sent.event_id

    def _reset_group_session(self, room_id: str) -> None:
        """After a failed send, make the next one start a fresh, fully shared Megolm session.

        nio 0.26 can leave a room stuck after a network error during key sharing: a
        "sharing" marker that is never cleared (later sends wait forever) or a session marked
        shared that some devices never received (they cannot decrypt what follows).
        """
        client = self._nio
        marker = client.sharing_session.pop(room_id, None)
        if marker is not None:
            marker.set()
        if client.olm is not None:
            client.invalidate_outbound_session(room_id)

    async def _direct_room(self, user_id: str) -> str:
        assert self._room_lock is not None
        async with self._room_lock:  # two callers must not create two rooms
            existing = direct_room_choice(self._nio.rooms, self.user_id, user_id)
            if existing is not None:
                return existing
            created = await self._nio.room_create(
                is_direct=True,
                invite=[user_id],
                preset=RoomPreset.private_chat,
                initial_state=[_ENCRYPTION_STATE],
                power_level_override=_POWER_LEVELS,
            )
            if not isinstance(created, RoomCreateResponse):
                raise self._failure("create direct room", created)
            await self._await_room(created.room_id, [user_id])
            return created.room_id

    async def _introduce(self, user_a: str, user_b: str, text: str) -> str:
        marker = {
            "type": INTRODUCTION_EVENT_TYPE,
            "state_key": "",
            "content": {"introducer": self.user_id, "peers": sorted([user_a, user_b])},
        }
        created = await self._nio.room_create(
            invite=[user_a, user_b],
            preset=RoomPreset.private_chat,
            initial_state=[_ENCRYPTION_STATE, marker],
            power_level_override=_POWER_LEVELS,
        )
        if not isinstance(created, RoomCreateResponse):
            raise self._failure("create introduction room", created)
        room_id = created.room_id
        # The room exists from here on: a failure names it, so the caller can log or retry.
        await self._translated(
            "introduce", self._post_introduction(room_id, user_a, user_b, text), room_id
        )
        return room_id

    async def _post_introduction(self, room_id: str, user_a: str, user_b: str, text: str) -> None:
        await self._await_room(room_id, [user_a, user_b])  # Megolm keys go to known members
        await self._send(room_id, {"msgtype": "m.text", "body": text}, None)

    async def _joined_rooms(self) -> tuple[str, ...]:
        return tuple(sorted(self._nio.rooms))

    async def _join(self, room_id: str) -> None:
        joined = await self._nio.join(room_id)
        if not isinstance(joined, JoinResponse):
            raise self._failure("join", joined, room_id)
        self._to_join.pop(room_id, None)
        await self._await_room(room_id, [])

    async def _publish_profile(self, room_id: str, content: dict[str, Any]) -> str:
        put = await self._nio.room_put_state(
            room_id, PROFILE_EVENT_TYPE, content, state_key=self.user_id
        )
        if not isinstance(put, RoomPutStateResponse):
            raise self._failure("publish profile", put, room_id)
        return put.event_id

    async def _shutdown(self) -> None:
        current = asyncio.current_task()
        others = [task for task in asyncio.all_tasks() if task is not current]
        for task in others:
            task.cancel()
        await asyncio.gather(*others, return_exceptions=True)
        if self._client is not None:
            await self._client.close()
