"""Secrets and files: redaction before anything is written, nothing secret in logs, modes.

Redaction is on by default (setting ``redact_secrets``): secret-shaped spans become
``[redacted:<kind>]`` and the event lists them under ``redactions``; the raw secret appears
nowhere in the database, its WAL or the logs. Off, the text is archived as sent. Text a
newer host already masked (hermes ``agent/redact.py``) is left as the host left it.
"""

from __future__ import annotations

import logging
import os
import stat
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from archive_provider.domain.redaction import (
    _TRIGGERS,
    holds_trigger,
    marker,
    redact_text,
    scan_text,
)
from archive_provider.host.provider import ArchiveProvider
from archive_provider.host.settings import save_settings
from archive_provider.storage.store import archive_dir
from archive_provider.storage.witness import Witness

from .conftest import events, flush, part_values, same_but_redacted

SECRETS = {
    "api_key": "sk-proj-Abcdefghijklmnopqrstuvwxyz0123456789",
    "github_token": "ghp_Abcdefghijklmnopqrstuvwxyz0123456789",
    "aws_access_key": "AKIAIOSFODNN7EXAMPLE",
    "slack_token": "xoxb-1234567890-abcdefghijklmn",
    "google_api_key": "AIzaSyA-abcdefghijklmnopqrstuvwxyz01234",
    "private_key": "-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEAabc\n-----END RSA PRIVATE KEY-----",
}
CONTEXTUAL = {  # (text, the secret part)
    "bearer_token": (
        "Authorization: Bearer abcdefghijklmnopqrstuvwxyz012345",
        "abcdefghijklmnopqrstuvwxyz012345",
    ),
    "url_password": ("clone https://deploy:Sup3rS3cretPw@git.example.com/x.git", "Sup3rS3cretPw"),
    "aws_secret_key": (
        "aws_secret_access_key = wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
        "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
    ),
}
ALL_SECRETS = [*SECRETS.values(), *(secret for _, secret in CONTEXTUAL.values())]


def sample_text() -> str:
    return " | ".join(
        [*(f"{k}: {v}" for k, v in SECRETS.items()), *(t for t, _ in CONTEXTUAL.values())]
    )


def archive_bytes(home: Path) -> bytes:
    folder = archive_dir(home)
    return b"".join(p.read_bytes() for p in folder.iterdir() if p.name.startswith("events.db"))


@pytest.fixture
def logs(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    with caplog.at_level(logging.DEBUG):
        yield caplog


def drive(provider: ArchiveProvider, text: str) -> None:
    messages = [
        {"role": "user", "content": text},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {
                        "name": "shell",
                        "arguments": f'{{"cmd": "{SECRETS["api_key"]}"}}',
                    },
                }
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": text},
        {"role": "assistant", "content": f"done with {SECRETS['github_token']}"},
    ]
    provider.sync_turn(text, "done", session_id="s1", messages=messages)
    provider.on_memory_write(
        "add", "memory", text, {"session_id": "s1", "old_text": SECRETS["aws_access_key"]}
    )
    assert provider.on_pre_compress(messages, require_checkpoint=True)
    provider.prefetch(f"what about {SECRETS['api_key']}")
    provider.on_delegation(text, text, child_session_id="c", note=f"key {SECRETS['api_key']}")
    provider.on_memory_write("add", f"memory {SECRETS['slack_token']}", "x", {"session_id": "s1"})
    provider.on_session_switch("s2", parent_session_id="s1", title=f"t {SECRETS['github_token']}")
    assert flush(provider)


def test_secrets_are_redacted_before_anything_is_written(
    home: Path, providers: Callable[..., ArchiveProvider], logs: pytest.LogCaptureFixture
) -> None:
    provider = providers()
    drive(provider, sample_text())
    data = archive_bytes(home)
    for secret in ALL_SECRETS:
        assert secret.encode() not in data, secret[:12]
    logged = "\n".join(r.getMessage() for r in logs.records)
    for secret in ALL_SECRETS:
        assert secret not in logged  # tokens never logged
    kinds_seen = set()
    for event in events(home):
        body = event.body
        for item in body.get("redactions", []) if isinstance(body, dict) else []:
            kinds_seen.add(item["kind"])
    assert kinds_seen >= set(SECRETS) | set(CONTEXTUAL)
    turn = next(e for e in events(home) if e.type == "turn")
    rows = part_values(home, turn.messages)
    for item in turn.body["redactions"]:  # every listed marker is where the list says
        _, _, index, *path = item["path"].split("/")
        value = rows[int(index)]
        for key in path:
            value = value[int(key)] if isinstance(value, list) else value[key]
        assert value[item["at"] :].startswith(marker(item["kind"]))


def test_redaction_can_be_switched_off(
    home: Path, providers: Callable[..., ArchiveProvider]
) -> None:
    save_settings(home, {"redact_secrets": False})
    provider = providers()
    drive(provider, sample_text())
    data = archive_bytes(home)
    assert SECRETS["github_token"].encode() in data
    assert all("redactions" not in e.body for e in events(home) if isinstance(e.body, dict))


def test_host_masked_text_is_left_alone_and_archives_match() -> None:
    from agent.redact import redact_sensitive_text

    for text in [*SECRETS.values(), *(t for t, _ in CONTEXTUAL.values()), sample_text()]:
        hosted = redact_sensitive_text(text, force=True)
        again, found = redact_text(hosted)
        # what the host masked stays as the host masked it; we mask only what it let through
        for secret in ALL_SECRETS:
            assert secret not in again
        if not any(secret in hosted for secret in ALL_SECRETS):
            assert again == hosted and not found
        assert redact_text(again) == (again, [])


def test_v2_host_hand_off_is_archived_as_the_host_redacted_it(
    home: Path, providers: Callable[..., ArchiveProvider]
) -> None:
    from agent.redact import redact_sensitive_text

    from tests.host.v2_host import V2MemoryManager

    provider = providers()
    manager = V2MemoryManager()
    manager.add_provider(provider)
    text = f"key {SECRETS['api_key']} and {SECRETS['github_token']}"
    manager.on_pre_compress(
        [{"role": "user", "content": text}],
        evidence_messages=[{"role": "user", "content": text}],
        require_checkpoint=True,
    )
    assert flush(provider)
    checkpoint = next(e for e in events(home) if e.type == "checkpoint")
    (row,) = part_values(home, checkpoint.body["evidence"])
    assert row["content"] == redact_sensitive_text(text, force=True)  # the host's masks, untouched
    assert "redactions" not in checkpoint.body


@settings(max_examples=300, deadline=None)
@given(
    prefix=st.text(max_size=40),
    suffix=st.text(max_size=40),
    kind=st.sampled_from(sorted(SECRETS)),
)
def test_redaction_is_idempotent_and_keeps_everything_else(
    prefix: str, suffix: str, kind: str
) -> None:
    text = f"{prefix} {SECRETS[kind]} {suffix}"
    redacted, found = redact_text(text)
    assert SECRETS[kind] not in redacted
    assert redact_text(redacted) == (redacted, [])
    assert same_but_redacted(text, redacted, found)  # only secret-shaped spans changed


def test_archive_folder_and_files_are_private(
    home: Path, providers: Callable[..., ArchiveProvider]
) -> None:
    keys = ("store.key", "signing.key")
    old = os.umask(0)  # the most permissive process umask: modes must not depend on it
    try:
        provider = providers()  # the writer makes the archive at its first event
        provider.sync_turn("hello", "hi", session_id="s1")
        assert provider.on_pre_compress([{"role": "user", "content": "x"}], require_checkpoint=True)
        folder = archive_dir(home)
        assert (folder / "events.db-wal").exists() and (folder / "events.db-shm").exists()
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700
        for name in ("events.db", "events.db-wal", "events.db-shm", *keys):
            assert stat.S_IMODE((folder / name).stat().st_mode) == 0o600, name
        witness = Witness.for_home(home)
        assert stat.S_IMODE(witness.directory.stat().st_mode) == 0o700
        assert stat.S_IMODE(witness.path.stat().st_mode) == 0o600
    finally:
        os.umask(old)


_FRAGMENTS = [
    *ALL_SECRETS,
    *(t for t, _ in CONTEXTUAL.values()),
    "sk-",
    "ghp_",
    "://",
    "@",
    "Bearer ",
    "AWS_SECRET_ACCESS_KEY=",
    "-----BEGIN ",
    "AIza",
    "xoxb-",
    "AKIA",
]


@settings(max_examples=500, deadline=None)
@given(st.lists(st.sampled_from(_FRAGMENTS) | st.text(max_size=30), max_size=8).map("".join))
def test_the_prefilter_never_changes_what_is_redacted(text: str) -> None:
    """The substring prefilter is only a shortcut: the result equals the full regex scan."""
    assert redact_text(text) == (scan_text(text) if len(text) >= 16 else (text, []))


@settings(max_examples=500, deadline=None)
@given(st.lists(st.sampled_from(_TRIGGERS) | st.text(max_size=12), max_size=6).map("".join))
def test_the_grouped_triggers_find_exactly_what_a_search_for_each_finds(text: str) -> None:
    """The triggers are searched group by group, each group behind one character of its
    members: a shortcut that must find a trigger whenever one is there, and only then."""
    assert holds_trigger(text) == any(trigger in text for trigger in _TRIGGERS)


def test_a_key_body_stops_at_the_next_begin_line() -> None:
    """Only the BEGIN that an END closes is a key; a stray BEGIN line above it is text.

    (The pattern used to run from each BEGIN to the end of the text in search of an END,
    so many BEGIN lines without one cost time quadratic in the text's length.)
    """
    stray = "-----BEGIN PRIVATE KEY-----\n"
    key = "-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASC\n-----END PRIVATE KEY-----"
    assert redact_text(stray + key) == (stray + marker("private_key"), [("private_key", 28)])
    lines = stray * 2000
    assert redact_text(lines) == (lines, [])
