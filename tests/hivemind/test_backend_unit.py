"""MatrixBackend pieces that need no homeserver: invite policy, sync digestion, lifecycle."""

from __future__ import annotations

import contextvars
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from nio import SyncResponse

from hivemind.matrix_backend import (
    INTRODUCTION_EVENT_TYPE,
    PROFILE_EVENT_TYPE,
    IntroductionSeen,
    MatrixBackend,
    MatrixSession,
    MatrixUnavailable,
    MemberSeen,
    ReceivedMessage,
    _digest,
    _invites,
    _Pending,
    context_thread,
    invite_allowed,
    server_name,
)

OWN = "@me:home.example"
TOKEN = "syt_c2VjcmV0_not_a_real_token_123456"


@pytest.mark.parametrize(
    ("inviter", "allow_users", "allow_servers", "allowed"),
    [
        ("@friend:home.example", (), None, True),  # default: own server only
        ("@friend:HOME.example", (), None, True),  # server names compare case-insensitively
        ("@mallory:evil.example", (), None, False),
        ("@mallory:evil.example", ("@carol:evil.example",), None, False),
        ("@carol:evil.example", ("@carol:evil.example",), None, True),
        ("@friend:home.example", ("@carol:evil.example",), (), False),  # () = users only
        ("@dave:partner.example", (), ("partner.example",), True),
        ("@friend:home.example", (), ("partner.example",), False),  # explicit list replaces
        ("not-a-user-id", (), None, False),
        ("@:home.example", (), None, False),
        ("@nobody", (), None, False),
    ],
)
def test_invite_policy(
    inviter: str,
    allow_users: tuple[str, ...],
    allow_servers: tuple[str, ...] | None,
    allowed: bool,
) -> None:
    assert invite_allowed(inviter, allow_users, allow_servers, "home.example") is allowed


def test_server_name_keeps_ports() -> None:
    assert server_name("@a:hs.example:8448") == "hs.example:8448"
    assert server_name("!room:hs") is None


def _sync(
    join_events: list[dict[str, Any]],
    state: list[dict[str, Any]] | None = None,
    invite_state: list[dict[str, Any]] | None = None,
) -> SyncResponse:
    rooms: dict[str, Any] = {
        "join": {
            "!r:hs": {
                "timeline": {"events": join_events, "limited": False, "prev_batch": "p"},
                "state": {"events": state or []},
            }
        },
        "invite": {},
        "leave": {},
    }
    if invite_state is not None:
        rooms["invite"] = {"!inv:hs": {"invite_state": {"events": invite_state}}}
    response = SyncResponse.from_dict({"next_batch": "s1", "rooms": rooms})
    assert isinstance(response, SyncResponse)
    return response


def _event(kind: str, sender: str, content: dict[str, Any], n: int, **extra: Any) -> dict:
    return {
        "type": kind,
        "sender": sender,
        "event_id": f"${n}",
        "origin_server_ts": n,
        "content": content,
        **extra,
    }


def test_digest_reports_peer_data_and_drops_spoofs_and_own_events() -> None:
    peer = "@peer:hs"
    events = [
        _event("m.room.message", peer, {"msgtype": "m.text", "body": "hi"}, 1),
        _event("m.room.message", OWN, {"msgtype": "m.text", "body": "mine"}, 2),
        _event(PROFILE_EVENT_TYPE, peer, {"interests": ["rust"]}, 3, state_key=peer),
        _event(PROFILE_EVENT_TYPE, peer, {"interests": ["lies"]}, 4, state_key="@other:hs"),
        _event(
            INTRODUCTION_EVENT_TYPE,
            "@carol:hs",
            {"introducer": "@someone-else:hs", "peers": [peer, OWN]},
            5,
            state_key="",
        ),
        _event(
            "m.room.member", peer, {"membership": "join", "displayname": "Peer"}, 6, state_key=peer
        ),
    ]
    pending = _Pending()
    _digest(_sync(events), OWN, pending)
    result = pending.result("s1")
    assert result.messages == (ReceivedMessage("$1", "!r:hs", peer, "hi", 1, False),)
    assert [(p.user_id, dict(p.profile)) for p in result.profiles] == [
        (peer, {"interests": ["rust"]})
    ]
    assert result.introductions == (
        IntroductionSeen("!r:hs", "@carol:hs", tuple(sorted([peer, OWN])), "$5", 5),
    )
    assert result.members == (MemberSeen("!r:hs", peer, "Peer", "join", "$6"),)


def test_invites_name_the_inviter_of_our_membership() -> None:
    invite_state = [
        {
            "type": "m.room.member",
            "sender": "@x:hs",
            "state_key": "@x:hs",
            "content": {"membership": "join"},
        },
        {
            "type": "m.room.member",
            "sender": "@inviter:hs",
            "state_key": OWN,
            "content": {"membership": "invite", "is_direct": True},
        },
    ]
    assert list(_invites(_sync([], invite_state=invite_state), OWN)) == [
        ("!inv:hs", "@inviter:hs", True)
    ]


def test_constructor_needs_exactly_one_credential(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        MatrixBackend("http://127.0.0.1:1", OWN, tmp_path)
    with pytest.raises(ValueError):
        MatrixBackend("http://127.0.0.1:1", OWN, tmp_path, access_token=TOKEN, password="pw")
    with pytest.raises(ValueError):
        MatrixBackend("http://127.0.0.1:1", "me", tmp_path, access_token=TOKEN)


def test_secrets_stay_out_of_reprs() -> None:
    assert TOKEN not in repr(MatrixSession(OWN, "DEV", TOKEN))


def test_context_thread_copies_contextvars() -> None:
    var: contextvars.ContextVar[str] = contextvars.ContextVar("var", default="unset")
    var.set("caller")
    seen: list[str] = []
    thread = context_thread(lambda: seen.append(var.get()), "probe")
    thread.start()
    thread.join(5)
    assert seen == ["caller"]
    assert thread.daemon and thread.name == "probe"


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_unreachable_homeserver_fails_fast_and_leaves_no_thread(tmp_path: Path) -> None:
    made: list[threading.Thread] = []

    def factory(target: Callable[[], None], name: str) -> threading.Thread:
        made.append(threading.Thread(target=target, name=name, daemon=True))
        return made[-1]

    backend = MatrixBackend(
        f"http://127.0.0.1:{_closed_port()}",
        OWN,
        tmp_path,
        access_token=TOKEN,
        thread_factory=factory,
        op_timeout=5,
    )
    started = time.monotonic()
    with pytest.raises(MatrixUnavailable) as info:
        backend.start()
    assert time.monotonic() - started < 5
    assert TOKEN not in str(info.value) and TOKEN not in repr(backend)
    assert [t.name for t in made] == ["hivemind-matrix-me"]
    assert not made[0].is_alive()
    with pytest.raises(MatrixUnavailable, match="not running"):
        backend.sync()
    backend.close()  # idempotent


def test_two_clients_stores_on_two_threads_never_mix(tmp_path: Path) -> None:
    """nio binds global peewee models per call; unserialized, one store's rows reach the other."""
    import sys

    from nio.crypto import OlmAccount

    from hivemind.matrix_backend import serialized_store

    store_class = serialized_store()
    for tag in "ab":
        (tmp_path / tag).mkdir()
    stores = {tag: store_class(f"@{tag}:hs", f"DEV{tag}", str(tmp_path / tag)) for tag in "ab"}
    for store in stores.values():
        store.save_account(OlmAccount())
    wrong: list[object] = []

    def hammer(tag: str) -> None:
        for i in range(100):
            stores[tag].save_sync_token(f"{tag}{i}")
            token = stores[tag].load_sync_token()
            if not str(token).startswith(tag):
                wrong.append(token)

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as possible
    try:
        threads = [threading.Thread(target=hammer, args=(tag,)) for tag in stores]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        sys.setswitchinterval(interval)
    assert wrong == []
    assert [s.load_sync_token() for s in stores.values()] == ["a99", "b99"]


def test_digest_keeps_a_sync_whole_when_a_peer_sends_odd_ids_and_timestamps() -> None:
    """One event a peer's server got wrong must not cost the others in the same sync."""
    peer = "@peer:hs"
    events = [
        _event(PROFILE_EVENT_TYPE, peer, {"interests": ["x"]}, 1, state_key=peer),
        _event(INTRODUCTION_EVENT_TYPE, peer, {"peers": [peer, OWN]}, 2, state_key=""),
        _event("m.room.message", peer, {"msgtype": "m.text", "body": "far future"}, 3),
        _event("m.room.message", peer, {"msgtype": "m.text", "body": "fine"}, 4),
    ]
    events[0]["event_id"] = ["not", "text"]
    del events[1]["event_id"]
    events[2]["origin_server_ts"] = 2**70
    pending = _Pending()
    _digest(_sync(events), OWN, pending)
    result = pending.result("s1")
    assert result.profiles == () and result.introductions == ()  # no usable id: not recorded
    assert result.messages == (
        ReceivedMessage("$3", "!r:hs", peer, "far future", 0, False),  # out of range: unknown
        ReceivedMessage("$4", "!r:hs", peer, "fine", 4, False),
    )


class _UnparsableSyncs:
    """A backend whose every sync fails the way nio does on an event it cannot parse."""

    def __init__(self) -> None:
        self.syncs = threading.Event()

    def sync(self, timeout_ms: int) -> None:
        self.syncs.set()
        raise TypeError("'>' not supported between instances of 'str' and 'int'")

    def close(self, timeout: float) -> None:
        pass


def test_a_sync_that_keeps_failing_is_reported_by_the_tools(tmp_path: Path) -> None:
    """The same bad response returns on every retry: the tools must say news may be stale."""
    from hivemind.link import PeerLink
    from hivemind.settings import HivemindSettings
    from hivemind.tools import PeerTools

    backend = _UnparsableSyncs()
    link = PeerLink(
        crypto_dir=tmp_path / "crypto",
        homeserver="http://127.0.0.1:9",
        user_id=OWN,
        access_token=TOKEN,
        device_id=None,
        settings=HivemindSettings(),
        submit=lambda build, label: None,
        read_token=lambda: None,
        spent=lambda since: [],
    )

    def connect(failures: int) -> Any:
        link._backend, link._connected = backend, True
        return backend

    link._connect = connect
    link.start()
    try:
        assert backend.syncs.wait(10)
        deadline = time.monotonic() + 10
        while link.error is None and time.monotonic() < deadline:
            time.sleep(0.01)
        tools = PeerTools(
            read=lambda reader: ([], []),
            record=lambda build, label: True,
            link=lambda: link,
            session=lambda: "s1",
            unavailable=lambda: "off",
        )
        listed = tools.handle("hivemind_list_peers", {})
    finally:
        link.close(5)
    assert listed["connected"] is True
    assert listed["sync_problem"] == (
        "peer sync fails (TypeError: '>' not supported between instances of 'str' and 'int');"
        " retrying"
    )


def test_messages_of_other_kinds_are_kept_with_their_msgtype() -> None:
    """An emote, a file, a msgtype hivemind does not know: recorded, never dropped."""
    peer = "@peer:hs"
    events = [
        _event("m.room.message", peer, {"msgtype": "m.emote", "body": "waves"}, 1),
        _event(
            "m.room.message",
            peer,
            {"msgtype": "m.file", "body": "notes.pdf", "url": "mxc://a/b"},
            2,
        ),
        _event("m.room.message", peer, {"msgtype": "org.example.card", "body": "hello"}, 3),
        _event("m.room.message", peer, {"msgtype": "org.example.blob", "data": [1, 2]}, 4),
    ]
    pending = _Pending()
    _digest(_sync(events), OWN, pending)
    assert [(m.event_id, m.body, m.msgtype) for m in pending.result("s1").messages] == [
        ("$1", "waves", "m.emote"),
        ("$2", "notes.pdf", "m.file"),
        ("$3", "hello", "org.example.card"),
        ("$4", "", "org.example.blob"),
    ]
