"""Deterministic extractive summaries of what a peer said, and the keyword normalizer they share
with spark detection.

Extractive and deterministic on purpose: a summary rebuilt from the log on replay must come out
identical, and it can only quote what the peer actually wrote (no model in the loop, no cost).
The text stays untrusted peer data: callers must present it as data, never as instructions.
"""

from __future__ import annotations

import math
import re
import unicodedata
from collections import Counter
from collections.abc import Iterable

_STOPWORD_TEXT = """
a about above after again against all also am an and any are as at be because been before
being below between both but by can could did do does doing don down during each either etc
few for from further had has have having he her here hers herself him himself his how i if in
into is it its itself just let like may me might more most much must my myself no nor not now
of off on once only or other our ours ourselves out over own per please same shall she should
so some such than that the their theirs them themselves then there these they this those
through to too under until up upon us very via was we were what when where which while who
whom why will with within without would yes yet you your yours yourself yourselves
hi hello hey thanks thank ok okay really get got make made use using used one two also well
agent agents hermes peer peers thing things something anything lot lots want need know think
"""
STOPWORDS = frozenset(_STOPWORD_TEXT.split())

_WORD = re.compile(r"[^\W_]+(?:['-][^\W_]+)*[+#]*")
_SENTENCE_BREAK = re.compile(r"(?<=[.!?])\s+|\n+")
_SPACE = re.compile(r"\s+")


def clean(text: str) -> str:
    """NFKC, control and format characters removed, whitespace collapsed to single spaces."""
    text = unicodedata.normalize("NFKC", text)
    text = "".join(
        " " if ch.isspace() else ch
        for ch in text
        if ch.isspace() or not unicodedata.category(ch).startswith("C")
    )
    return _SPACE.sub(" ", text).strip()


def _fold(word: str) -> str:
    """Crude, predictable plural folding: 'libraries' -> 'library', 'keys' -> 'key'."""
    if len(word) > 4 and word.endswith("ies"):
        return word[:-3] + "y"
    if len(word) > 3 and word.endswith("s") and not word.endswith(("ss", "us", "is")):
        return word[:-1]
    return word


def keywords(text: str) -> list[str]:
    """Normalized content words of ``text`` in order (casefolded, stopwords and numbers out)."""
    words = _WORD.findall(unicodedata.normalize("NFKC", text).casefold())
    return [
        _fold(word)
        for word in words
        if len(word) >= 2 and word not in STOPWORDS and not word.isdigit()
    ]


def _sentences(texts: Iterable[str]) -> list[str]:
    seen: set[str] = set()
    out: list[str] = []
    for text in texts:
        for piece in _SENTENCE_BREAK.split(unicodedata.normalize("NFKC", text)):
            sentence = clean(piece)
            key = sentence.casefold()
            if sentence and key not in seen:
                seen.add(key)
                out.append(sentence)
    return out


def _shorten(text: str, max_chars: int) -> str:
    if len(text) <= max_chars:
        return text
    cut = text[: max_chars - 1]
    if " " in cut:
        cut = cut.rsplit(" ", 1)[0]
    return cut.rstrip(" ,;:") + "…"


def summarize(texts: Iterable[str], *, max_sentences: int = 3, max_chars: int = 300) -> str:
    """The peer's most characteristic sentences, in their original order, at most ``max_chars``.

    A sentence scores the corpus frequency of its distinct keywords, divided by the square
    root of their number so long rambling sentences do not win by size; ties go to the
    earlier sentence. Same input, same output.
    """
    if max_sentences < 1 or max_chars < 2:
        raise ValueError("max_sentences must be >= 1 and max_chars >= 2")
    sentences = _sentences(texts)
    if not sentences:
        return ""
    words = [set(keywords(s)) for s in sentences]
    frequency = Counter(word for sentence_words in words for word in sentence_words)

    def score(index: int) -> float:
        distinct = words[index]
        if not distinct:
            return 0.0
        return sum(frequency[w] for w in distinct) / math.sqrt(len(distinct))

    ranked = sorted(range(len(sentences)), key=lambda i: (-score(i), i))
    chosen = sorted(ranked[:max_sentences])
    while len(chosen) > 1 and len(" ".join(sentences[i] for i in chosen)) > max_chars:
        worst = max(chosen, key=ranked.index)
        chosen.remove(worst)
    return _shorten(" ".join(sentences[i] for i in chosen), max_chars)
