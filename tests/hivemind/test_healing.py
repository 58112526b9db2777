"""Self-healing sync against the real Synapse: a timeline gap is backfilled from /messages
before anything is derived, two agents that open a conversation at once converge on one
room, an unreachable homeserver marks peer state stale (and recovers), and events nio cannot
parse are archived as rejected peer input.
"""

from __future__ import annotations

import threading
import urllib.parse
from typing import Any

import jsonschema
import pytest

from archive_provider.host.schemas import load_event_schema
from hivemind import matrix_backend
from hivemind.context import FENCE_CLOSE
from hivemind.matrix_backend import RejectedEvent, rejection_reason

from .agents import call, home_of, logged, peer_ids, unread_from, wait_for
from .test_matrix import sync_until

pytestmark = pytest.mark.synapse

ALGO = "m.megolm.v1.aes-sha2"
STALE = "Stale: the homeserver has not answered since"


def messages_from(home: Any, sender: str) -> list[Any]:
    return [e for e in logged(home, "peer_message_received") if e.body["sender"] == sender]


def send_raw(homeserver: Any, user: Any, room: str, txn: str, content: dict[str, Any]) -> str:
    quoted = urllib.parse.quote(room, safe="")
    path = f"/_matrix/client/v3/rooms/{quoted}/send/m.room.message/{txn}"
    return str(homeserver.client_api(user.access_token, "PUT", path, content)["event_id"])


def test_a_gap_is_backfilled_for_three_agents_before_summaries_are_derived(
    make_user: Any, make_agent: Any
) -> None:
    alice, bob, carol = make_user("alice"), make_user("bob"), make_user("carol")
    b = make_agent(bob, timeline_limit=3)
    a = make_agent(alice, contacts=[bob.user_id])
    c = make_agent(carol, contacts=[bob.user_id])
    for sender in (a, c):
        assert call(sender, "hivemind_send_to_peer", peer_name=bob.user_id, message="hello")["sent"]
    wait_for(lambda: peer_ids(b) == {alice.user_id, carol.user_id}, what="Bob knows both")
    wait_for(lambda: unread_from(b, carol.user_id) == 1, what="Bob has Carol's hello")
    home = home_of(b)
    b.shutdown()  # Bob is away while both write more than one sync returns

    sent = {alice.user_id: [], carol.user_id: []}
    for i in range(8):
        for user, sender in ((alice, a), (carol, c)):
            text = f"{user.user_id} note {i}: attestation detail {i}"
            reply = call(sender, "hivemind_send_to_peer", peer_name=bob.user_id, message=text)
            sent[user.user_id].append(reply["event_id"])

    b2 = make_agent(bob, home=home, timeline_limit=3)
    for user in (alice, carol):
        got = wait_for(
            lambda user=user: (
                len(messages_from(home, user.user_id)) == 9 and messages_from(home, user.user_id)
            ),
            what="every message of the gap",
        )
        ids = [e.key["event_id"] for e in got]
        assert ids[1:] == sent[user.user_id]  # all of them, in order
        flags = [e.body.get("backfilled", False) for e in got[1:]]
        assert flags == [True] * 5 + [False] * 3  # the sync returned the last 3
        for event in got:
            jsonschema.validate(event.body, load_event_schema("peer_message_received"))
        # The summary derived after the gap already covers the backfilled messages.
        summary = wait_for(
            lambda user=user, last=ids[-1]: [
                e
                for e in logged(home, "peer_summary_updated")
                if e.body["peer"] == user.user_id and e.body["covers"][-1] == last
            ],
            what="a summary covering the gap",
        )
        assert summary[0].body["covers"] == ids
    positions = [e.body for e in logged(home, "peer_sync_position") if "limited_rooms" in e.body]
    assert positions and all("unfilled_rooms" not in body for body in positions)
    assert unread_from(b2, alice.user_id) == 9


def test_a_gap_longer_than_the_backfill_bound_is_recorded_as_unfilled(
    make_user: Any, make_backend: Any, monkeypatch: pytest.MonkeyPatch, homeserver: Any
) -> None:
    alice, bob = make_user("alice"), make_user("bob")
    a, b = make_backend(alice), make_backend(bob, timeline_limit=3)
    a.start()
    b.start()
    room = a.direct_room_for(bob.user_id)
    sync_until(b, lambda r: room in b.joined_rooms())
    first = a.send_text(room, "first")
    sync_until(b, lambda r: any(m.event_id == first for m in r.messages))
    sent = [a.send_text(room, f"gap {i}") for i in range(10)]
    monkeypatch.setattr(matrix_backend, "BACKFILL_PAGE", 2)
    monkeypatch.setattr(matrix_backend, "BACKFILL_PAGES", 2)
    result = b.sync(0)
    assert result.limited_rooms == (room,) and result.unfilled_rooms == (room,)
    got = [m for m in result.messages if m.room_id == room]
    assert [m.event_id for m in got] == sent[-7:]  # 4 backfilled (2 pages of 2) + the 3 synced
    assert [m.backfilled for m in got] == [True] * 4 + [False] * 3
    assert all(m.encrypted and m.body.startswith("gap") for m in got)  # decrypted backfill


def test_two_agents_opening_a_conversation_at_once_converge_on_one_room(
    make_user: Any, make_agent: Any
) -> None:
    alice, bob = make_user("alice"), make_user("bob")
    a = make_agent(alice, contacts=[bob.user_id])
    b = make_agent(bob, contacts=[alice.user_id])
    replies: dict[str, dict[str, Any]] = {}
    start = threading.Barrier(2)

    def open_conversation(me: Any, name: str, other: Any) -> None:
        start.wait()
        replies[name] = call(me, "hivemind_send_to_peer", peer_name=other.user_id, message="hi!")

    threads = [
        threading.Thread(target=open_conversation, args=(a, "a", bob)),
        threading.Thread(target=open_conversation, args=(b, "b", alice)),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert replies["a"]["sent"] and replies["b"]["sent"]
    rooms = {replies["a"]["room_id"], replies["b"]["room_id"]}
    for me, other in ((a, bob), (b, alice)):  # whatever the race made, both see it all
        wait_for(lambda me=me, other=other: unread_from(me, other.user_id) == 1, what="hi")
        wait_for(
            lambda me=me, other=other: (
                {
                    r["room_id"]
                    for r in call(me, "hivemind_get_peer_info", peer_name=other.user_id)["rooms"]
                    if r["membership"] == "join"
                }
                >= rooms
            ),
            what="both rooms joined by both",
        )
    again = [
        call(a, "hivemind_send_to_peer", peer_name=bob.user_id, message="again from Alice"),
        call(b, "hivemind_send_to_peer", peer_name=alice.user_id, message="again from Bob"),
    ]
    assert again[0]["room_id"] == again[1]["room_id"] == min(rooms)


def test_a_room_the_peer_never_joined_does_not_win(
    make_user: Any, make_backend: Any, homeserver: Any
) -> None:
    """Bob refuses Alice's invites (policy) but joins one of her two rooms by hand: the room
    both joined wins over the one where Bob is only invited, even though its id sorts later."""
    alice, bob = make_user("alice"), make_user("bob")
    a = make_backend(alice)
    b = make_backend(bob, allow_servers=())  # Bob joins nobody's rooms on his own
    a.start()
    b.start()
    encryption = {"type": "m.room.encryption", "state_key": "", "content": {"algorithm": ALGO}}
    made = [
        homeserver.client_api(
            alice.access_token,
            "POST",
            "/_matrix/client/v3/createRoom",
            {"preset": "private_chat", "invite": [bob.user_id], "initial_state": [encryption]},
        )["room_id"]
        for _ in range(2)
    ]
    invited_only, both_joined = sorted(made)
    b.join(both_joined)
    sync_until(a, lambda r: any(m.room_id == both_joined for m in r.members))
    assert set(a.joined_rooms()) >= set(made)
    assert a.direct_room_for(bob.user_id) == both_joined
    assert b.direct_room_for(alice.user_id) == both_joined


def test_an_unreachable_homeserver_marks_peer_state_stale_until_it_answers(
    make_user: Any, make_agent: Any, homeserver: Any
) -> None:
    alice, bob = make_user("alice"), make_user("bob")
    a = make_agent(alice, contacts=[bob.user_id])
    b = make_agent(bob)
    assert call(a, "hivemind_send_to_peer", peer_name=bob.user_id, message="hello")["sent"]
    wait_for(lambda: unread_from(b, alice.user_id) == 1, what="Bob knows Alice")
    assert STALE not in b.prefetch("peers?")
    with homeserver.down():
        block = wait_for(lambda: STALE in b.prefetch("peers?") and b.prefetch("peers?"))
        stale_line = block.splitlines()[2]
        assert stale_line.startswith(STALE) and "retrying with back-off" in stale_line
        assert block.endswith(FENCE_CLOSE) and alice.user_id in block  # last known state
    wait_for(lambda: STALE not in b.prefetch("peers?"), deadline_s=40, what="recovery")
    states = [e.body["state"] for e in logged(home_of(b), "peer_link_state")]
    assert states == ["offline", "online"]
    for event in logged(home_of(b), "peer_link_state"):
        jsonschema.validate(event.body, load_event_schema("peer_link_state"))
    assert call(a, "hivemind_send_to_peer", peer_name=bob.user_id, message="back")["sent"]
    wait_for(lambda: unread_from(b, alice.user_id) == 2, what="messages flow again")


def test_events_nio_cannot_parse_are_archived_as_rejected_input(
    make_user: Any, make_agent: Any, homeserver: Any
) -> None:
    alice, bob = make_user("alice"), make_user("bob")
    b = make_agent(bob)
    room = homeserver.client_api(
        alice.access_token,
        "POST",
        "/_matrix/client/v3/createRoom",
        {"preset": "private_chat", "invite": [bob.user_id]},
    )["room_id"]
    wait_for(lambda: alice.user_id in peer_ids(b), what="Bob joined Alice's room")
    # Synapse checks body and msgtype; nio's schema also wants formatted_body to be text.
    malformed = {"msgtype": "m.text", "body": "look", "formatted_body": 42, "format": "x"}
    bad = send_raw(homeserver, alice, room, "bad1", malformed)
    good = send_raw(homeserver, alice, room, "ok1", {"msgtype": "m.text", "body": "fine"})
    wait_for(lambda: unread_from(b, alice.user_id) == 1, what="the good message")
    [rejected] = wait_for(lambda: logged(home_of(b), "peer_input_rejected"), what="rejected")
    assert rejected.key == {"event_id": bad}
    assert rejected.body["sender"] == alice.user_id and rejected.body["room_id"] == room
    assert rejected.body["event_type"] == "m.room.message"
    assert (
        "body" in rejected.body["reason"]
        and "42 is not of type 'string'" in rejected.body["reason"]
    )
    jsonschema.validate(rejected.body, load_event_schema("peer_input_rejected"))
    assert [m["event_id"] for m in call(b, "hivemind_check_messages")["messages"]] == [good]


def test_an_event_without_the_core_fields_is_described_as_not_an_event() -> None:
    reason = rejection_reason({"content": {}}, known_shape=False)
    assert reason.startswith("not an event")
    assert RejectedEvent("!r:hs", "", "", "", reason, {}).event_id == ""
