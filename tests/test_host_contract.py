"""Pure parts of issue 17: turn authors, the host's redaction masks, the author part.

The host-driven rows (tier B, main's manager mirrored) are in tests/host/test_tier_b.py;
these pin the pure functions they rely on.
"""

from __future__ import annotations

import json

import pytest

from archive_provider.domain import builders
from archive_provider.domain.authors import author_label, normalize_author
from archive_provider.domain.redaction import (
    HOST_MASK_KINDS,
    host_masks,
    host_masks_in,
    redact_text,
    redact_value,
)
from archive_provider.format.canonical import decode
from archive_provider.format.events import Hasher


def test_authors_are_cleaned_as_the_host_cleans_them_and_extra_keys_kept() -> None:
    raw = {"id": " U1\x00 ", "name": "Ada\u200b \U0001f916" + "x" * 300, "is_bot": "YES",
           "platform": "slack", "origin": "desk-1"}  # fmt: skip
    author = normalize_author(raw, "sync_turn")
    assert author is not None
    assert author["id"] == "U1" and author["is_bot"] is True
    assert author["name"].startswith("Ada\u200b \U0001f916") and len(author["name"]) == 200
    assert (author["platform"], author["origin"], author["source"]) == (
        "slack",
        "desk-1",
        "sync_turn",
    )
    assert normalize_author(json.dumps({"id": "U2"}), "sync_turn") == {
        "id": "U2", "name": None, "is_bot": False, "source": "sync_turn"}  # fmt: skip


@pytest.mark.parametrize(
    "raw",
    [None, "", "not json", ["U1"], {"id": "", "name": " "}, {"id": None, "name": "\x07"}, 42],
)
def test_no_author_when_the_host_names_nobody(raw: object) -> None:
    assert normalize_author(raw, "sync_turn") is None
    assert author_label(None) == "—"


def test_plugin_authors_keep_the_bot_flag_the_host_gave_never_a_derived_one() -> None:
    human_looking = normalize_author({"id": "bot:ops/alice", "is_bot": False}, "on_turn_start")
    plugin = normalize_author({"id": "plugin:cron", "is_bot": True}, "sync_turn")
    assert human_looking is not None and human_looking["is_bot"] is False
    assert plugin is not None and plugin["is_bot"] is True
    assert author_label(plugin) == "<plugin:cron> [bot]"


def test_the_author_is_a_payload_of_its_own_never_in_the_identity_key() -> None:
    """The envelope's ``author`` names it (FORMAT.md 13.1): not a part, not in the body."""
    hasher = Hasher(b"k" * 32)
    message = hasher.part({"role": "user", "content": "hi"})
    author = {"id": "U1", "name": "Ada", "is_bot": False, "source": "sync_turn"}
    event = builders.turn(hasher, "s", 1, [message], start=0, legacy=False, author=author)
    plain = builders.turn(hasher, "s", 1, [message], start=0, legacy=False)
    assert event.author is not None and decode(event.author.body) == author
    assert plain.author is None
    assert event.key == plain.key  # same turn, same identity: the author is not what makes it
    assert event.parts == plain.parts and event.body == plain.body
    assert "Ada" not in json.dumps(event.key) and "author" not in event.body


HOST_MASKED = {
    "head_tail": "key sk-pro...7890 rotated",
    "stars": "PASSWORD=***",
    "redacted_label": "read «redacted:ghp_…» from the file",
    "vault_label": "vault gave «redacted-vault-secret»",
    "private_key_label": "-----BEGIN-ish [REDACTED PRIVATE KEY]",
    "bearer_redacted": "Authorization: Bearer [redacted]",
    # main's _redact_for_provider: a token masked once in a hand-off, replaced everywhere
    "learned_redacted": 'export API_TOKEN=[redacted] and retry; {"api_key": "[redacted]"}',
    "redaction_unavailable": "[redaction-unavailable]",
}


def test_every_host_mask_shape_is_detected_and_left_alone_by_our_redaction() -> None:
    assert set(HOST_MASKED) == set(HOST_MASK_KINDS)
    for kind, text in HOST_MASKED.items():
        assert {k for k, _ in host_masks_in(text)} == {kind}, text
        assert redact_text(text) == (text, []), text  # a no-op on already-masked spans
    value = {"messages": [{"role": "user", "content": HOST_MASKED["stars"]}]}
    assert redact_value(value) == (value, [])
    assert host_masks(value) == [{"path": "/messages/0/content", "kind": "stars", "at": 9}]


@pytest.mark.parametrize(
    "text", ["wait... what", "***bold***", "see [redacted:api_key]", "a ** b", "x = 3"]
)
def test_ordinary_text_and_our_own_markers_are_not_host_masks(text: str) -> None:
    assert host_masks_in(text) == []
