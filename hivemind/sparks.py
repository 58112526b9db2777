"""Spark detection: which known peers, not yet introduced, seem to share interests.

Pure and deterministic, so the same peers projection always yields the same suggestions in the
same order (a replayed log must suggest what the live one did). Interests come from two places
in a peer's profile mapping: ``interests`` (declared, weight 2 per keyword) and ``summary``
(what the peer is about, weight 1 per keyword). A pair's score is the sum, over the keywords
both share, of the smaller weight; a pair is a spark when the score reaches ``min_score``
(default 2: one shared declared interest, or two shared summary keywords).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from itertools import combinations
from typing import Any

from hivemind.summaries import keywords

DECLARED_WEIGHT = 2
SUMMARY_WEIGHT = 1


@dataclass(frozen=True)
class Spark:
    """A suggested introduction; ``peer_a`` < ``peer_b``, so a pair has one spelling."""

    peer_a: str
    peer_b: str
    shared: tuple[str, ...]
    score: int

    @property
    def pair(self) -> tuple[str, str]:
        return (self.peer_a, self.peer_b)


def pair_key(a: str, b: str) -> tuple[str, str]:
    """The unordered pair {a, b} as a sorted tuple: (a, b) and (b, a) are the same pair."""
    return (a, b) if a <= b else (b, a)


def interest_weights(profile: Mapping[str, Any]) -> dict[str, int]:
    """Keyword -> weight for one peer's profile; tolerant of missing or odd-typed fields."""
    weights: dict[str, int] = {}
    summary = profile.get("summary")
    if isinstance(summary, str):
        for word in keywords(summary):
            weights[word] = max(weights.get(word, 0), SUMMARY_WEIGHT)
    declared = profile.get("interests")
    items = [declared] if isinstance(declared, str) else declared
    if isinstance(items, (list, tuple)):
        for item in items:
            if isinstance(item, str):
                for word in keywords(item):
                    weights[word] = DECLARED_WEIGHT
    return weights


def detect_sparks(
    peers: Mapping[str, Mapping[str, Any]],
    introduced_pairs: Iterable[tuple[str, str]],
    dismissed_pairs: Iterable[tuple[str, str]],
    *,
    min_score: int = DECLARED_WEIGHT,
) -> list[Spark]:
    """Unintroduced, undismissed pairs of ``peers`` (user id -> profile) that share interests.

    Ordered by score (highest first), then by the pair's user ids.
    """
    excluded = {pair_key(a, b) for a, b in (*introduced_pairs, *dismissed_pairs)}
    weights = {user_id: interest_weights(profile) for user_id, profile in peers.items()}
    sparks = []
    for a, b in combinations(sorted(weights), 2):
        if (a, b) in excluded:
            continue
        wa, wb = weights[a], weights[b]
        common = {word: min(wa[word], wb[word]) for word in wa.keys() & wb.keys()}
        score = sum(common.values())
        if common and score >= min_score:
            shared = tuple(sorted(common, key=lambda w: (-common[w], w)))
            sparks.append(Spark(a, b, shared, score))
    sparks.sort(key=lambda s: (-s.score, s.peer_a, s.peer_b))
    return sparks
