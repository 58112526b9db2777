"""Spark detection: deterministic, unordered pairs, never a dismissed or introduced pair."""

from __future__ import annotations

from hivemind.sparks import Spark, detect_sparks, interest_weights, pair_key

CAROL = "@carol:example.org"
DAVE = "@dave:example.org"
ERIN = "@erin:example.org"
FRANK = "@frank:example.org"

PEERS = {
    CAROL: {"interests": ["TEE attestation", "Rust"], "summary": "Security researcher."},
    DAVE: {"interests": ["frontend", "Rust"], "summary": "Builds remote attestation dashboards."},
    ERIN: {"interests": ["TEE attestation"], "summary": "Works on remote attestation."},
    FRANK: {"interests": ["gardening"], "summary": "Grows tomatoes."},
}


def test_shared_interests_make_sparks_ordered_by_score_then_ids() -> None:
    sparks = detect_sparks(PEERS, [], [])
    assert [s.pair for s in sparks] == [(CAROL, ERIN), (CAROL, DAVE), (DAVE, ERIN)]
    assert sparks[0] == Spark(CAROL, ERIN, ("attestation", "tee"), 4)
    assert sparks[1].shared == ("rust", "attestation")
    assert sparks[1].score == 3
    assert all(FRANK not in s.pair for s in sparks)


def test_introduced_and_dismissed_pairs_are_never_suggested_in_either_order() -> None:
    sparks = detect_sparks(PEERS, introduced_pairs=[(ERIN, CAROL)], dismissed_pairs=[[DAVE, CAROL]])
    assert [s.pair for s in sparks] == [(DAVE, ERIN)]


def test_result_does_not_depend_on_input_order() -> None:
    reversed_peers = dict(reversed(list(PEERS.items())))
    assert detect_sparks(reversed_peers, [], []) == detect_sparks(PEERS, [], [])


def test_pairs_are_unordered() -> None:
    assert pair_key(DAVE, CAROL) == pair_key(CAROL, DAVE) == (CAROL, DAVE)
    assert all(s.peer_a < s.peer_b for s in detect_sparks(PEERS, [], []))


def test_weak_overlap_below_threshold_is_not_a_spark() -> None:
    peers = {
        CAROL: {"summary": "Likes compilers."},
        DAVE: {"summary": "Writes compilers."},
    }
    assert detect_sparks(peers, [], []) == []
    assert [s.pair for s in detect_sparks(peers, [], [], min_score=1)] == [(CAROL, DAVE)]


def test_odd_profiles_are_tolerated() -> None:
    peers = {
        CAROL: {"interests": "Rust", "summary": None},
        DAVE: {"interests": ["rust", 7, None]},
        ERIN: {},
    }
    assert [s.pair for s in detect_sparks(peers, [], [])] == [(CAROL, DAVE)]
    assert interest_weights({"interests": ["Libraries"], "summary": "library"}) == {"library": 2}


def test_no_peers_no_sparks() -> None:
    assert detect_sparks({}, [], []) == []
    assert detect_sparks({CAROL: PEERS[CAROL]}, [], []) == []
