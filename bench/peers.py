"""The alternatives a user could pick: the ``eventsourcing`` library and hermes' holographic store.

eventsourcing runs as its documentation shows: an ``Application`` with an ``Aggregate`` per
conversation, persisted through ``PERSISTENCE_MODULE=eventsourcing.sqlite``, one ``save``
per event. It leaves SQLite's ``synchronous`` at the default (FULL: every commit waits for
an fsync of the WAL), which costs it most of its time; so the bench also runs it with
``synchronous=NORMAL`` (the level the project's ordinary appends use) to compare like with
like.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from .common import Row, Workdir, median

_Conversation: Any = None


def _aggregate() -> Any:
    """The aggregate class, defined on first use so the bench imports without eventsourcing."""
    global _Conversation
    if _Conversation is None:
        from eventsourcing.domain import Aggregate, event

        class Conversation(Aggregate):  # type: ignore[misc]
            @event("Started")
            def __init__(self, session: str) -> None:
                self.session = session
                self.turns = 0

            @event("TurnRecorded")
            def record(self, messages: list[dict[str, Any]]) -> None:
                self.turns += 1

        _Conversation = Conversation
    return _Conversation


_SYNCHRONOUS: list[str | None] = [None]


def eventsourcing_app(path: Path, *, synchronous: str | None = None) -> Any:
    """An eventsourcing Application on SQLite at ``path`` (optionally with a synchronous level).

    The level is applied to every connection the library's pool opens, the first included.
    """
    from eventsourcing.application import Application
    from eventsourcing.sqlite import SQLiteConnectionPool

    if not getattr(SQLiteConnectionPool, "_bench_patched", False):
        original = SQLiteConnectionPool._create_connection

        def create(self: Any) -> Any:
            connection = original(self)
            if _SYNCHRONOUS[0]:
                connection._sqlite_conn.execute(f"PRAGMA synchronous = {_SYNCHRONOUS[0]}")
            return connection

        SQLiteConnectionPool._create_connection = create  # type: ignore[method-assign]
        SQLiteConnectionPool._bench_patched = True  # type: ignore[attr-defined]
    _SYNCHRONOUS[0] = synchronous
    return Application(
        env={"PERSISTENCE_MODULE": "eventsourcing.sqlite", "SQLITE_DBNAME": str(path)}
    )


def eventsourcing_turns(
    path: Path, turns: Sequence[tuple[str, list[dict[str, Any]]]], *, synchronous: str | None = None
) -> float:
    """Seconds to record ``turns`` ((session, new messages) pairs), one save per event."""
    app = eventsourcing_app(path, synchronous=synchronous)
    Conversation = _aggregate()
    conversations: dict[str, Any] = {}
    start = time.perf_counter()
    for session, messages in turns:
        conversation = conversations.get(session)
        if conversation is None:
            conversation = conversations[session] = Conversation(session)
        conversation.record(messages)
        app.save(conversation)
    seconds = time.perf_counter() - start
    app.close()
    return seconds


def eventsourcing_rows(
    work: Workdir,
    row: str,
    what: str,
    figure: float,
    unit: str,
    turns: Sequence[tuple[str, list[dict[str, Any]]]],
    runs: int,
    say: Callable[[str], None],
) -> list[Row]:
    """``figure`` beside the library recording the very same ``turns`` (median of ``runs``):
    as shipped, where the >= 10x target applies, and at synchronous=NORMAL (info)."""
    shipped, normal = (
        len(turns)
        / median(
            [
                eventsourcing_turns(work.fresh("es") / "es.db", turns, synchronous=level)
                for _ in range(runs)
            ]
        )
        for level in (None, "NORMAL")
    )
    say(f"  eventsourcing: {shipped:,.0f}/s as shipped, {normal:,.0f}/s at NORMAL")
    counted = {unit.split("/")[0]: len(turns)}
    return [
        Row(
            row,
            f"{what} vs eventsourcing (as shipped: synchronous=FULL)",
            figure,
            unit,
            shipped,
            "eventsourcing",
            target_kind="min",
            target_value=10,
            target_text=">= 10x eventsourcing",
            extra=counted,
        ),
        Row(
            row,
            f"{what} vs eventsourcing at synchronous=NORMAL (info)",
            figure,
            unit,
            normal,
            "eventsourcing NORMAL",
            extra=counted,
            note="same durability level as the project's ordinary appends; no target",
        ),
    ]


def eventsourcing_read_back(path: Path) -> tuple[float, int]:
    """(seconds, events) to read every stored event of the Application at ``path`` back.

    Through the notification log, a page at a time, each mapped to its domain event: the
    library's own way to read its whole log. It checks nothing (it keeps no digests).
    """
    app = eventsourcing_app(path)
    count, position = 0, 1
    start = time.perf_counter()
    while True:
        page = app.recorder.select_notifications(start=position, limit=1000)
        if not page:
            break
        for notification in page:
            app.mapper.to_domain_event(notification)
        count += len(page)
        position = page[-1].id + 1
    seconds = time.perf_counter() - start
    app.close()
    return seconds, count
