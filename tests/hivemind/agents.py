"""Helpers for tests that run HivemindProviders against the session Synapse."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from archive_provider.storage.store import EventStore, archive_dir
from hivemind import HivemindProvider

T = TypeVar("T")

TEST_SETTINGS = {"poll_ms": 1000, "op_timeout_s": 10, "connect_wait_s": 15, "close_timeout_s": 5}


def call(provider: HivemindProvider, tool: str, **args: Any) -> dict[str, Any]:
    """A tool call as the host makes it; the result must be a JSON object."""
    result = json.loads(provider.handle_tool_call(tool, args))
    assert isinstance(result, dict)
    return result


def wait_for(probe: Callable[[], T | None], deadline_s: float = 20.0, what: str = "") -> T:
    """Poll ``probe`` until it returns something truthy."""
    end = time.monotonic() + deadline_s
    while True:
        found = probe()
        if found:
            return found
        if time.monotonic() > end:
            raise AssertionError(f"not within {deadline_s} s: {what or probe}")
        time.sleep(0.1)


def peer_ids(provider: HivemindProvider) -> set[str]:
    return {p["user_id"] for p in call(provider, "hivemind_list_peers")["peers"]}


def unread_from(provider: HivemindProvider, user_id: str) -> int:
    peers = call(provider, "hivemind_list_peers")["peers"]
    return next((p["unread"] for p in peers if p["user_id"] == user_id), 0)


def logged(home: Path, *types: str) -> list[Any]:
    """The profile's events (of the given types), read on a fresh connection."""
    store = EventStore.open(archive_dir(home), create=False, readonly=True)
    try:
        return [e for e in store.events() if not types or e.type in types]
    finally:
        store.close()


def write_config(home: Path, **values: Any) -> None:
    path = home / "hivemind" / "config.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({**TEST_SETTINGS, **values}))


def home_of(provider: HivemindProvider) -> Path:
    assert provider.core.home is not None
    return provider.core.home


def localpart(user: Any) -> str:
    return str(user.user_id)[1:].split(":")[0]


def log_bytes(home: Path) -> bytes:
    """Every byte of a profile's archive (database, WAL, key): for secret scans."""
    return b"".join(p.read_bytes() for p in sorted(archive_dir(home).iterdir()) if p.is_file())
