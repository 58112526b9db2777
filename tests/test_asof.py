"""Time travel: as_of at any sequence number or time equals the projections of that prefix."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from freezegun import freeze_time
from hypothesis import HealthCheck, given, settings

from archive_provider.audit.as_of import as_of, resolve_seq
from archive_provider.domain import builders
from archive_provider.projections.builtin import SessionLink
from archive_provider.projections.registry import default_projections
from archive_provider.storage.store import EventStore

from .test_replay import SEQUENCES, START, drive


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(ops=SEQUENCES)
def test_asof_at_every_seq_equals_the_live_projection_of_that_prefix(
    tmp_path: Path, ops: list[tuple[Any, ...]]
) -> None:
    for run in drive(tmp_path, ops):
        store = run.store
        assert as_of(store, seq=0).memory == {} and as_of(store, seq=0).links == []
        for seq, live in run.asof.items():
            answer = as_of(store, seq=seq)
            assert answer.digests == {name: run.digests[seq][name] for name in answer.digests}
            assert (answer.memory, answer.links, answer.recalls, answer.time) == (
                live.memory,
                live.links,
                live.recalls,
                live.time,
            )
            for session in ("s1", "s2", "s3"):
                mine, theirs = (
                    as_of(store.conn, seq=seq, session=session),
                    run.asof_by_session[seq, session],
                )
                assert (mine.lineage, mine.links, mine.recalls, mine.recall) == (
                    theirs.lineage,
                    theirs.links,
                    theirs.recalls,
                    theirs.recall,
                )
            # the same moment, named by its time: the last event stamped at or before it
            at = run.times[seq]
            expected = max(s for s, t in run.times.items() if t <= at)
            assert as_of(store, time=at).seq == expected


def test_asof_answers_for_a_time_a_session_and_the_recall_of_that_turn(tmp_path: Path) -> None:
    with freeze_time(START) as frozen:
        store = EventStore.open(tmp_path / "a", projections=default_projections())
        base = store.head().seq  # v2 starts with store_created
        h = store.hasher
        store.append([builders.session_started("s1", at="1", details={"platform": "cli"})])
        store.append([builders.memory_write(h, "s1", 1, "add", "user", "Prefers dark mode", {})])
        frozen.tick(timedelta(hours=1))
        store.append(
            [
                builders.recall_served(
                    h, "s1", turn=2, query="mode?", result="dark", sources=[2], at="a"
                )
            ]
        )
        store.append(
            [
                builders.memory_write(
                    h, "s1", 2, "replace", "user", "Prefers light mode", {"old_text": "dark mode"}
                )
            ]
        )
        frozen.tick(timedelta(hours=1))
        store.append(
            [
                builders.session_switched(
                    "s2",
                    previous="s1",
                    at="2",
                    details={"parent_session_id": "s1", "reason": "compression"},
                )
            ]
        )
        store.append(
            [builders.recall_served(h, "s2", turn=1, query="q", result="r", sources=[], at="b")]
        )

        early = as_of(store, time=START + timedelta(minutes=30))
        assert (
            early.seq == base + 2
            and early.memory == {"user": ["Prefers dark mode"]}
            and early.recall is None
        )
        middle = as_of(store, time=(START + timedelta(hours=1)).isoformat(), session="s1")
        assert middle.seq == base + 4 and middle.memory == {"user": ["Prefers light mode"]}
        assert middle.recall is not None and (middle.recall.turn, middle.recall.result) == (
            2,
            "dark",
        )
        now = as_of(store, session="s2")
        assert now.seq == base + 6 and now.lineage == [
            SessionLink(base + 5, "s2", "s1", "compression", "compression")
        ]
        assert [r.session for r in now.recalls] == ["s2"] and now.recall.query == "q"  # type: ignore[union-attr]
        assert as_of(store, time="2000-01-01").seq == 0
        naive = (START + timedelta(minutes=30)).replace(tzinfo=None)
        assert as_of(store, time=naive).seq == base + 2  # a naive time is UTC, not local time
        store.close()


def test_resolve_seq_refuses_what_is_not_a_prefix(tmp_path: Path) -> None:
    store = EventStore.open(tmp_path / "a")
    store.append([builders.session_started("s1", at="1", details={})])
    head = store.head().seq
    with pytest.raises(ValueError, match="not both"):
        resolve_seq(store.conn, seq=head, time="2026-01-01")
    with pytest.raises(ValueError, match="outside"):
        resolve_seq(store.conn, seq=head + 1)
    assert resolve_seq(store.conn) == head
    store.close()


def test_asof_reads_a_store_opened_read_only(tmp_path: Path) -> None:
    store = EventStore.open(tmp_path / "a")
    store.append([builders.memory_write(store.hasher, "s1", 1, "add", "memory", "fact", {})])
    store.close()
    reader = EventStore.open(tmp_path / "a", readonly=True)
    assert as_of(reader).memory == {"memory": ["fact"]}
    reader.close()
