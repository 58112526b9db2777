"""The workload: sessions of turns made of Zipf text, shaped the way Hermes sends them.

A Hermes 0.19.0 host re-sends the whole transcript with every ``sync_turn`` (system
prompt, then user/assistant pairs), so a session's k-th turn archives two new messages at
transcript position ``1 + 2(k-1)`` (the first turn also carries the system prompt). The
same shapes feed the provider, the bulk log builder, the raw baselines and the peers.

Text comes from ``bench.corpus``, the project's own realistic generator, so
benchmarks and recall tests share one word distribution.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from archive_provider.domain import builders
from archive_provider.domain.clock import now_text
from archive_provider.format.events import NewEvent
from archive_provider.projections.registry import default_projections
from archive_provider.storage.store import EventStore

SYSTEM = {"role": "system", "content": "You are Hermes, a helpful assistant. Be concise and exact."}
TURNS_PER_SESSION = 20


class Text(Protocol):
    def exchange(self, size: int) -> tuple[str, str]: ...

    def query(self) -> str: ...

    def common_query(self) -> str: ...


def corpus(seed: int = 7) -> tuple[Text, str]:
    """The text generator (the project's Zipf vocabulary) and its name."""
    from bench.corpus_adapter import ProjectText

    return ProjectText(seed), "bench.corpus (Zipf s=1.07, 30k words)"


@dataclass
class Session:
    """One conversation as the host holds it: the transcript so far."""

    name: str
    messages: list[dict[str, Any]]
    turns: int = 0

    def next_turn(self, text: Text, size: int) -> tuple[str, str, list[dict[str, Any]]]:
        """Grow the transcript by one exchange; returns (user, assistant, full transcript)."""
        user, assistant = text.exchange(size)
        self.messages.append({"role": "user", "content": user})
        self.messages.append({"role": "assistant", "content": assistant})
        self.turns += 1
        return user, assistant, self.messages


def sessions(prefix: str, text: Text, size: int, turns: int) -> Iterator[tuple[Session, str, str]]:
    """``turns`` turns over fresh sessions of TURNS_PER_SESSION turns each."""
    session: Session | None = None
    for index in range(turns):
        if session is None or session.turns >= TURNS_PER_SESSION:
            session = Session(f"{prefix}-{index // TURNS_PER_SESSION:07d}", [dict(SYSTEM)])
        user, assistant, _ = session.next_turn(text, size)
        yield session, user, assistant


def turn_events(
    store: EventStore, prefix: str, text: Text, size: int, turns: int
) -> Iterator[NewEvent]:
    """The events the provider would log for those turns (session_started, then turns)."""
    at = now_text()
    for session, _user, _assistant in sessions(prefix, text, size, turns):
        k = session.turns
        if k == 1:
            yield builders.session_started(session.name, at=at, details={"platform": "bench"})
            new = session.messages[:3]
            start = 0
        else:
            new = session.messages[-2:]
            start = 1 + 2 * (k - 1)
        parts = [store.hasher.part(message) for message in new]
        yield builders.turn(store.hasher, session.name, k, parts, start=start, legacy=False)


@dataclass
class BuiltLog:
    folder: Path
    events: int
    turns: int
    seconds: float


def bulk_append(store: EventStore, events: Iterator[NewEvent], batch: int = 5000) -> int:
    """Setup only: big transactions of ``batch`` events (never how the project writes)."""
    count = 0
    chunk: list[NewEvent] = []
    for event in events:
        chunk.append(event)
        if len(chunk) >= batch:
            with store.transaction():
                store.append_in_transaction(chunk)
            count += len(chunk)
            chunk = []
    if chunk:
        with store.transaction():
            store.append_in_transaction(chunk)
        count += len(chunk)
    return count


def log_events(
    store: EventStore, turns: int, seed: int, plants: Mapping[int, str] | None = None
) -> Iterator[NewEvent]:
    """The big logs' events: the project's corpus stream (sessions of 40 turns, each closed
    by a checkpoint of its last ten messages and session_ended), with ``plants`` (facts by
    turn index) in their turns' user texts."""
    from bench.corpus import corpus_events

    for event, _planted in corpus_events(store.hasher, turns, seed=seed, plants=plants):
        yield event


def build_log(
    folder: Path,
    turns: int,
    *,
    seed: int = 7,
    projections: bool = True,
    store: EventStore | None = None,
    plants: Mapping[int, str] | None = None,
) -> BuiltLog:
    """Append ``turns`` turns (and their session events) to the store in ``folder``; a new
    store is made in the default format, as a new archive is."""
    start = time.perf_counter()
    own = store is None
    if store is None:
        store = EventStore.open(
            folder,
            projections=default_projections() if projections else (),
        )
    store.conn.execute("PRAGMA cache_size = -262144")  # 256 MiB page cache for the build
    try:
        appended = bulk_append(store, log_events(store, turns, seed, plants))
        store.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        if own:
            store.close()
    return BuiltLog(folder, appended, turns, time.perf_counter() - start)


def copy_log(source: Path, target: Path) -> Path:
    """Copy an archive folder (database checkpointed first, so the copy is one file)."""
    shutil.copytree(source, target, dirs_exist_ok=True)
    return target
