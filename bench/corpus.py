"""A synthetic but realistic archive for recall tests and benchmarks.

Conversations are drawn from a Zipf-distributed vocabulary (English function words at the
head, invented words below), so term frequencies look like real chat: a few words are in
most texts, most words are rare. A planted fact can be dropped into one turn; its words
sit at mid-frequency ranks of the same vocabulary, so thousands of other texts share some
of them (and explicit near-misses share most of them), which is what makes finding it in
the top few a real test of ranking.

Events go straight through :meth:`EventStore.append_in_transaction` in large
transactions: the same builders, identities, chain and projections as the provider, without
the writer thread.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from itertools import accumulate
from typing import TYPE_CHECKING

from archive_provider.domain import builders
from archive_provider.format.events import Hasher, NewEvent, Part

if TYPE_CHECKING:
    from archive_provider.storage.store import EventStore

PLANTED_FACT = (
    "The spare key for the garden shed is taped under the third blue flowerpot by the gate."
)
PLANTED_QUERY = "Where did I put the spare key for the garden shed?"
#: the fact's topical words and the vocabulary rank each is given (lower = more common)
FACT_RANKS = {
    "spare": 180,
    "key": 90,
    "garden": 260,
    "shed": 700,
    "taped": 1400,
    "third": 120,
    "blue": 150,
    "flowerpot": 2600,
    "gate": 400,
    "put": 60,
}
NEAR_MISSES = (
    "I keep a spare key for the car in the kitchen drawer.",
    "The garden shed roof leaks again after the storm.",
    "Did you put the blue flowerpot back by the gate?",
    "The key to the garden gate is on the hook.",
    "We taped the spare cable under the desk.",
)

_FUNCTION_TEXT = """
the of and to a in is it you that he was for on are with as i his they be at one have this from
or had by not but what some we can out other were all there when up use your how said an each
she which do their time if will way about many then them would write like so these her long make
thing see him two has look more day could go come did my no most who over know than call first
people may down side been now find any new work part take get place made live where after back
little only round man year came show every good me give our under name very through just form
much great think say help low line before turn cause same mean differ move right boy old too does
tell sentence set want air well also play small end home read hand port large spell add even land
here must big high such follow act why ask men change went light kind off need house picture try
us again animal point mother world near build self earth father
"""
_SYLLABLE_TEXT = (
    "ka ro mi tel san por lin dra vex qua bel mon tri zu fen gal hor isk jun lor mar nev ost pel"
    " rin sor tun ul vin wer yal zen bra cle dro fli gro pla sta tru"
)
FUNCTION_WORDS = tuple(_FUNCTION_TEXT.split())
_SYLLABLES = tuple(_SYLLABLE_TEXT.split())


class Vocabulary:
    """Words by rank with Zipf weights ``1 / (rank + 2.7) ** exponent``."""

    def __init__(self, size: int = 30000, *, exponent: float = 1.07, seed: int = 1) -> None:
        rng = random.Random(seed)
        reserved = set(FACT_RANKS) | set(FUNCTION_WORDS)
        invented: list[str] = []
        seen = set(reserved)
        while len(invented) < size:
            word = "".join(rng.choice(_SYLLABLES) for _ in range(rng.choice((2, 2, 3, 3, 4))))
            if word not in seen:
                seen.add(word)
                invented.append(word)
        words = list(FUNCTION_WORDS) + invented
        for word, rank in sorted(FACT_RANKS.items(), key=lambda item: item[1]):
            words.insert(rank, word)
        self.words = words[:size]
        self.cumulative = list(
            accumulate(1.0 / (rank + 2.7) ** exponent for rank in range(len(self.words)))
        )

    def sentence(self, rng: random.Random, length: int) -> str:
        return self._sentence(rng, rng.choices(self.words, cum_weights=self.cumulative, k=length))

    def text(self, rng: random.Random, sentences: int) -> str:
        """``sentences`` sentences of 5 to 22 words (one draw for all their words)."""
        lengths = [rng.randint(5, 22) for _ in range(sentences)]
        words = rng.choices(self.words, cum_weights=self.cumulative, k=sum(lengths))
        out, at = [], 0
        for length in lengths:
            out.append(self._sentence(rng, words[at : at + length]))
            at += length
        return " ".join(out)

    @staticmethod
    def _sentence(rng: random.Random, words: list[str]) -> str:
        return f"{words[0].capitalize()} {' '.join(words[1:])}{rng.choice('...?!')}"


@dataclass(frozen=True)
class CorpusInfo:
    turns: int
    events: int
    sessions: int
    planted_seq: int | None  # seq of the turn holding the planted fact


def corpus_events(
    hasher: Hasher,
    turns: int,
    *,
    seed: int = 7,
    turns_per_session: int = 40,
    plant_at: int | None = None,
    near_misses: int = 200,
    vocabulary: Vocabulary | None = None,
    plants: Mapping[int, str] | None = None,
) -> Iterator[tuple[NewEvent, bool]]:
    """Yield ``(event, planted)`` for ``turns`` turns in sessions of ``turns_per_session``.

    Each session starts with ``session_started`` and ends with a checkpoint of its last ten
    messages (as a compression would), then ``session_ended``. ``near_misses`` user texts
    reuse most of the fact's words without being it. ``plants`` puts more facts into the
    user texts of the turns it names (by turn index from 0).
    """
    rng = random.Random(seed)
    vocab = vocabulary or Vocabulary()
    miss_every = max(turns // max(near_misses, 1), 1) if near_misses else 0
    done = 0
    session_no = 0
    while done < turns:
        session_no += 1
        session = f"corpus-{seed}-{session_no:06d}"
        yield (
            builders.session_started(session, at=f"{session_no}", details={"platform": "corpus"}),
            False,
        )
        recent: list[Part] = []
        for ordinal in range(1, min(turns_per_session, turns - done) + 1):
            planted = plant_at == done
            user = vocab.text(rng, rng.randint(1, 3))
            if planted:
                user = f"{vocab.sentence(rng, 8)} {PLANTED_FACT} {vocab.sentence(rng, 6)}"
            elif plants and done in plants:
                user = f"{vocab.sentence(rng, 8)} {plants[done]} {vocab.sentence(rng, 6)}"
            elif miss_every and done % miss_every == miss_every // 2:
                user = f"{vocab.sentence(rng, 7)} {rng.choice(NEAR_MISSES)}"
            parts = [
                hasher.part({"role": "user", "content": user}),
                hasher.part({"role": "assistant", "content": vocab.text(rng, rng.randint(2, 5))}),
            ]
            recent = (recent + parts)[-10:]
            yield (
                builders.turn(
                    hasher, session, ordinal, parts, start=2 * (ordinal - 1), legacy=False
                ),
                planted,
            )
            done += 1
        yield (
            builders.checkpoint(
                hasher,
                session,
                recent,
                parent_session="",
                host_api_version=2,
                require_checkpoint=False,
                received=len(recent),
            ),
            False,
        )
        yield (
            builders.session_ended(session, at=f"{session_no}", message_count=2 * len(recent)),
            False,
        )


def build(
    store: EventStore,
    turns: int,
    *,
    seed: int = 7,
    plant_at: int | None = None,
    batch: int = 5000,
    progress: Callable[[int], None] | None = None,
    turns_per_session: int = 40,
    near_misses: int = 200,
) -> CorpusInfo:
    """Append a corpus of ``turns`` turns to ``store`` in transactions of ``batch`` events."""
    pending: list[NewEvent] = []
    planted_index: int | None = None
    events = sessions = 0
    planted_seq = None

    def flush() -> None:
        nonlocal planted_seq, planted_index
        with store.transaction():
            results = store.append_in_transaction(pending)
        if planted_index is not None:
            planted_seq, planted_index = results[planted_index].seq, None
        pending.clear()
        if progress is not None:
            progress(events)

    for event, planted in corpus_events(
        store.hasher,
        turns,
        seed=seed,
        turns_per_session=turns_per_session,
        plant_at=plant_at,
        near_misses=near_misses,
    ):
        if planted:
            planted_index = len(pending)
        pending.append(event)
        events += 1
        sessions += event.type == "session_started"
        if len(pending) >= batch:
            flush()
    if pending:
        flush()
    return CorpusInfo(turns, events, sessions, planted_seq)
