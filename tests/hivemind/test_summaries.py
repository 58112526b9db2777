"""Extractive summaries: deterministic, bounded, made only of what the peer wrote."""

from __future__ import annotations

import pytest

from hivemind.summaries import clean, keywords, summarize

TALK = [
    "Hi! I work on TEE attestation for confidential VMs.",
    "Attestation reports are signed by the CPU vendor.",
    "The weather is nice today.",
    "We verify attestation reports before releasing secrets to the VM.",
    "Lunch was good.",
]


def test_picks_the_characteristic_sentences_in_original_order() -> None:
    summary = summarize(TALK, max_sentences=2)
    assert summary == (
        "Attestation reports are signed by the CPU vendor. "
        "We verify attestation reports before releasing secrets to the VM."
    )


def test_is_deterministic_and_bounded() -> None:
    long_talk = TALK * 20 + [f"Attestation detail number {i} about reports." for i in range(50)]
    first = summarize(long_talk, max_chars=120)
    assert first == summarize(long_talk, max_chars=120)
    assert 0 < len(first) <= 120


def test_a_single_long_sentence_is_cut_at_a_word_boundary() -> None:
    summary = summarize(["attestation " * 100], max_chars=50)
    assert len(summary) <= 50
    assert summary.endswith("attestation…")


def test_only_quotes_the_input_and_strips_control_characters() -> None:
    summary = summarize(["Deploys\u200b the\x1b[31m attestation service.\nAttestation rocks."])
    assert "\x1b" not in summary and "\u200b" not in summary
    assert summary == "Deploys the[31m attestation service. Attestation rocks."


def test_duplicates_and_empty_input() -> None:
    assert summarize([]) == ""
    assert summarize(["   ", "\n"]) == ""
    assert summarize(["Rust is great.", "rust is great."]) == "Rust is great."
    with pytest.raises(ValueError):
        summarize(TALK, max_sentences=0)


def test_keywords_normalize() -> None:
    assert keywords("The TEE-based Libraries, C++ and keys in 2024!") == [
        "tee-based",
        "library",
        "c++",
        "key",
    ]
    assert clean("  a\tb\n\nc ") == "a b c"
