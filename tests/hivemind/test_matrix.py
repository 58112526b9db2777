"""MatrixBackend against a real Synapse on 127.0.0.1: plain and E2EE messages, introductions,
restart from the crypto store, invite policy, and a homeserver outage.
"""

from __future__ import annotations

import logging
import threading
import time
import urllib.parse
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import pytest

from hivemind.matrix_backend import MatrixBackend, MatrixError, MatrixUnavailable, SyncResult

pytestmark = pytest.mark.synapse

T = TypeVar("T")


def sync_until(
    backend: MatrixBackend, pick: Callable[[SyncResult], T | None], deadline_s: float = 15.0
) -> tuple[T, list[SyncResult]]:
    """Sync until ``pick`` finds something; returns it and every result seen on the way."""
    seen: list[SyncResult] = []
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        seen.append(backend.sync(500))
        found = pick(seen[-1])
        if found:
            return found, seen
    raise AssertionError(f"not seen within {deadline_s} s; saw {seen}")


def message(event_id: str) -> Callable[[SyncResult], Any]:
    return lambda r: next((m for m in r.messages if m.event_id == event_id), None)


def invite_from(user_id: str) -> Callable[[SyncResult], Any]:
    return lambda r: next((i for i in r.invites if i.inviter == user_id), None)


def connected_pair(
    make_user: Any, make_backend: Any
) -> tuple[Any, Any, MatrixBackend, MatrixBackend, str]:
    """Alice and Bob, started, sharing an encrypted direct room that both have joined."""
    alice, bob = make_user("alice"), make_user("bob")
    a, b = make_backend(alice), make_backend(bob)
    a.start()
    b.start()
    room = a.direct_room_for(bob.user_id)
    invite, _ = sync_until(b, invite_from(alice.user_id))
    assert invite.room_id == room and invite.accepted and invite.is_direct
    return alice, bob, a, b, room


def test_plain_and_encrypted_messages_flow_both_ways(
    make_user: Any, make_backend: Any, homeserver: Any
) -> None:
    alice, bob, a, b, room = connected_pair(make_user, make_backend)

    sent = a.send_text(room, "hello Bob, this is encrypted")
    got, _ = sync_until(b, message(sent))
    assert (got.room_id, got.sender, got.body, got.encrypted) == (
        room,
        alice.user_id,
        "hello Bob, this is encrypted",
        True,
    )
    assert got.origin_server_ts > 0

    assert b.direct_room_for(alice.user_id) == room  # found, not created again
    reply = b.send_text(room, "hi Alice")
    got, _ = sync_until(a, message(reply))
    assert (got.sender, got.body, got.encrypted) == (bob.user_id, "hi Alice", True)

    # A plain room, made outside the backend (it only ever creates encrypted ones).
    plain = homeserver.client_api(
        alice.access_token,
        "POST",
        "/_matrix/client/v3/createRoom",
        {"preset": "private_chat", "invite": [bob.user_id]},
    )["room_id"]
    sync_until(b, invite_from(alice.user_id))
    a.join(plain)  # already a member: waits until sync knows the room
    sent = a.send_text(plain, "plain hello")
    got, _ = sync_until(b, message(sent))
    assert (got.room_id, got.body, got.encrypted) == (plain, "plain hello", False)

    assert a.send_text(room, "once", txn_id="t-1") == a.send_text(room, "once", txn_id="t-1")


def test_many_threads_share_one_backend_while_a_long_poll_runs(
    make_user: Any, make_backend: Any
) -> None:
    alice, bob, a, b, room = connected_pair(make_user, make_backend)
    polled: list[SyncResult] = []
    poller = threading.Thread(target=lambda: polled.append(a.sync(3000)))
    poller.start()
    with ThreadPoolExecutor(4) as pool:
        sent = list(pool.map(lambda i: a.send_text(room, f"message {i}"), range(8)))
    poller.join(10)
    assert polled and len(set(sent)) == 8

    received: dict[str, str] = {}
    deadline = time.monotonic() + 15
    while len(received) < 8 and time.monotonic() < deadline:
        received.update((m.event_id, m.body) for m in b.sync(500).messages if m.encrypted)
    assert sorted(received) == sorted(sent)
    assert sorted(received.values()) == [f"message {i}" for i in range(8)]


def test_close_interrupts_a_long_poll_within_its_bound(make_user: Any, make_backend: Any) -> None:
    a = make_backend(make_user("alice"))
    a.start()
    a.sync(0)
    outcome: list[BaseException] = []

    def poll() -> None:
        try:
            a.sync(30_000)
        except MatrixUnavailable as exc:
            outcome.append(exc)

    poller = threading.Thread(target=poll)
    poller.start()
    time.sleep(0.3)  # the long poll is now waiting on the server
    started = time.monotonic()
    a.close(timeout=5)
    poller.join(5)
    assert time.monotonic() - started < 5
    assert len(outcome) == 1 and "closed" in str(outcome[0])
    with pytest.raises(MatrixUnavailable, match="not running"):
        a.send_text("!any:localhost", "too late")


def test_introduction_room_is_joined_by_both_and_profiles_are_seen(
    make_user: Any, make_backend: Any
) -> None:
    alice, bob, carol = make_user("alice"), make_user("bob"), make_user("carol")
    a, b = make_backend(alice), make_backend(bob)
    c = make_backend(carol, password=carol.password)  # the login path: a new device
    for backend in (a, b, c):
        backend.start()
    assert c.session is not None and c.session.device_id != carol.device_id

    text = "Alice, meet Bob: you both work on TEE attestation."
    room = c.create_introduction_room(alice.user_id, bob.user_id, text)

    for backend in (a, b):
        got, seen = sync_until(
            backend, lambda r: next((m for m in r.messages if m.room_id == room), None)
        )
        assert (got.sender, got.body, got.encrypted) == (carol.user_id, text, True)
        intros = [i for r in seen for i in r.introductions]
        assert [(i.room_id, i.introducer, i.peers) for i in intros] == [
            (room, carol.user_id, tuple(sorted([alice.user_id, bob.user_id])))
        ]
        assert all(i.accepted for r in seen for i in r.invites)

    a.publish_profile(room, {"interests": ["TEE attestation"], "summary": "Alice's agent"})
    profile, _ = sync_until(
        b, lambda r: next((p for p in r.profiles if p.user_id == alice.user_id), None)
    )
    assert profile.room_id == room and profile.profile["interests"] == ["TEE attestation"]
    joined, _ = sync_until(
        c,
        lambda r: (
            {m.user_id for m in r.members if m.membership == "join"} >= {alice.user_id, bob.user_id}
            or None
        ),
    )
    assert joined


def test_restart_from_store_resumes_without_redelivery(
    make_user: Any, make_backend: Any, tmp_path: Any
) -> None:
    alice, bob = make_user("alice"), make_user("bob")
    a = make_backend(alice)
    b = make_backend(bob, store_dir=tmp_path / "bob-store")
    a.start()
    b.start()
    room = a.direct_room_for(bob.user_id)
    sync_until(b, invite_from(alice.user_id))
    first = a.send_text(room, "before the restart")
    _, seen_before = sync_until(b, message(first))
    b.close()

    second = a.send_text(room, "while Bob was away")
    # Same store, no device id given: whoami finds it, the crypto store and token are reused.
    b2 = make_backend(bob, store_dir=tmp_path / "bob-store", device_id=None)
    b2.start()
    assert b2.session is not None and b2.session.device_id == bob.device_id
    got, seen_after = sync_until(b2, message(second))
    assert got.encrypted and got.body == "while Bob was away"
    third = a.send_text(room, "after the restart")
    seen_after += sync_until(b2, message(third))[1]
    seen_after.append(b2.sync(0))

    ids_before = [m.event_id for r in seen_before for m in r.messages]
    ids_after = [m.event_id for r in seen_after for m in r.messages]
    assert first in ids_before and first not in ids_after
    assert ids_after == [second, third]  # each exactly once


def test_invites_outside_the_policy_are_ignored(make_user: Any, make_backend: Any) -> None:
    alice, bob, mallory = make_user("alice"), make_user("bob"), make_user("mallory")
    a, m = make_backend(alice), make_backend(mallory)
    b = make_backend(bob, allow_users=[alice.user_id], allow_servers=())
    for backend in (a, b, m):
        backend.start()

    spam_room = m.direct_room_for(bob.user_id)
    ignored, _ = sync_until(b, invite_from(mallory.user_id))
    assert (ignored.room_id, ignored.accepted) == (spam_room, False)
    m.send_text(spam_room, "click here")

    good_room = a.direct_room_for(bob.user_id)
    accepted, _ = sync_until(b, invite_from(alice.user_id))
    assert (accepted.room_id, accepted.accepted) == (good_room, True)
    hello = a.send_text(good_room, "hello")
    _, seen = sync_until(b, message(hello))
    assert all(msg.room_id != spam_room for r in seen for msg in r.messages)
    assert b.direct_room_for(mallory.user_id) != spam_room  # never joined it


def test_a_room_we_were_removed_from_is_forgotten(
    make_user: Any, make_backend: Any, homeserver: Any
) -> None:
    alice, bob, a, b, room = connected_pair(make_user, make_backend)
    quoted = urllib.parse.quote(room, safe="")
    homeserver.client_api(
        alice.access_token,
        "POST",
        f"/_matrix/client/v3/rooms/{quoted}/kick",
        {"user_id": bob.user_id, "reason": "test"},
    )
    sync_until(b, lambda r: room in r.left_rooms)
    with pytest.raises(MatrixError, match="not a member") as info:
        b.send_text(room, "still there?")
    assert info.value.room_id == room
    assert b.direct_room_for(alice.user_id) != room


def test_outage_fails_fast_then_sync_and_send_resume(
    make_user: Any,
    make_backend: Any,
    homeserver: Any,
    tmp_path: Any,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    alice, bob, a, b, room = connected_pair(make_user, make_backend)
    sync_until(b, message(a.send_text(room, "before the outage")))
    # Bob gains a device: Alice's next message needs a new Megolm session, shared over a new
    # Olm session (one-time key claim), and that is exactly where the outage strikes.
    b_new = make_backend(bob, password=bob.password, store_dir=tmp_path / "bob-new")
    b_new.start()
    a.sync(0)

    with homeserver.down():
        started = time.monotonic()
        with pytest.raises(MatrixUnavailable) as sent:
            a.send_text(room, "into the void")
        with pytest.raises(MatrixUnavailable):
            b.sync(0)
        assert time.monotonic() - started < 10
    assert sent.value.room_id == room

    after = a.send_text(room, "after the outage")
    for device in (b, b_new):
        got, _ = sync_until(device, message(after))
        assert got.encrypted and got.body == "after the outage"

    for secret in (alice.access_token, bob.access_token):
        assert secret not in str(sent.value) and secret not in repr(a)
        assert secret not in caplog.text
