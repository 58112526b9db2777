"""Adapter from the project's corpus generator (``bench.corpus``) to the bench.

The bench asks for messages of a given size and for two kinds of queries; the project's
:class:`~bench.corpus.Vocabulary` gives Zipf sentences. Both benchmarks and
recall tests then draw from one word distribution.
"""

from __future__ import annotations

import random


class ProjectText:
    """Messages of about ``size`` bytes and queries, from the project's Zipf vocabulary."""

    def __init__(self, seed: int) -> None:
        from bench.corpus import FUNCTION_WORDS, Vocabulary

        self.rng = random.Random(seed)
        self.vocab = Vocabulary()
        self.function_words = set(FUNCTION_WORDS)
        self.common = list(self.vocab.words[:60])

    def text(self, size: int) -> str:
        out: list[str] = []
        length = 0
        while length < size:
            sentence = self.vocab.sentence(self.rng, self.rng.randint(5, 22))
            out.append(sentence)
            length += len(sentence) + 1
        return " ".join(out)

    def exchange(self, size: int) -> tuple[str, str]:
        user = max(size * 2 // 5, 16)
        return self.text(user), self.text(max(size - user - 1, 16))

    def query(self) -> str:
        """A question: a few function words around 2-4 topical words drawn as text draws them."""
        rng = self.rng
        topical: list[str] = []
        wanted = rng.randint(2, 4)
        while len(topical) < wanted:
            word = rng.choices(self.vocab.words, cum_weights=self.vocab.cumulative, k=1)[0]
            if word not in self.function_words and word not in topical:
                topical.append(word)
        glue = rng.sample(
            ["what", "how", "did", "we", "the", "about", "with", "for", "where"], rng.randint(1, 3)
        )
        words = glue + topical
        rng.shuffle(words)
        return " ".join(words) + "?"

    def common_query(self) -> str:
        """A query made only of the most frequent words (in most texts)."""
        return " ".join(self.rng.choice(self.common) for _ in range(self.rng.randint(3, 7)))
