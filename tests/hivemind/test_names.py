"""peer_name resolution: exactly one user id, or an error that says why."""

from __future__ import annotations

import pytest

from hivemind.names import AmbiguousPeer, UnknownPeer, resolve_peer

PEERS = {
    "@carol:example.org": "Carol",
    "@carol:other.net": "Carol",
    "@dave:example.org": "hermes-of-dave",
    "@erin:example.org": None,
}


@pytest.mark.parametrize(
    ("name", "user_id"),
    [
        ("@carol:other.net", "@carol:other.net"),
        ("  @Dave:example.org ", "@dave:example.org"),
        ("hermes-of-dave", "@dave:example.org"),
        ("HERMES-OF-DAVE", "@dave:example.org"),
        ("dave", "@dave:example.org"),
        ("erin", "@erin:example.org"),
    ],
)
def test_resolves_user_ids_display_names_and_localparts(name: str, user_id: str) -> None:
    assert resolve_peer(name, PEERS) == user_id


def test_ambiguous_display_name_lists_the_candidates() -> None:
    with pytest.raises(AmbiguousPeer) as info:
        resolve_peer("carol", PEERS)
    assert info.value.candidates == ("@carol:example.org", "@carol:other.net")
    assert "Carol (@carol:example.org)" in str(info.value)
    assert "Carol (@carol:other.net)" in str(info.value)


def test_display_name_wins_over_another_peers_localpart() -> None:
    peers = {"@x1:hs": "dave", "@dave:hs": "Someone"}
    assert resolve_peer("dave", peers) == "@x1:hs"


@pytest.mark.parametrize("name", ["mallory", "@mallory:example.org", "", "   "])
def test_unknown_names_are_errors(name: str) -> None:
    with pytest.raises(UnknownPeer):
        resolve_peer(name, PEERS)


def test_unknown_error_mentions_known_peers_or_none() -> None:
    with pytest.raises(UnknownPeer, match="Known peers: Carol"):
        resolve_peer("zed", PEERS)
    with pytest.raises(UnknownPeer, match="No peers are known yet"):
        resolve_peer("zed", {})
