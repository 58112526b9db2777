"""Sizes for each mode: ``--smoke`` (seconds, for the test), ``--quick`` (< 2 min), ``--full``."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Config:
    name: str
    #: events in the big log(s) that verify, replay, recall, storage and sync_turn run on
    log_sizes: tuple[int, ...]
    #: row 1: per event size, events for one-per-transaction and for group/bulk (eventsourcing
    #: records the group run's events)
    append: dict[int, dict[str, int]] = field(default_factory=dict)
    repeats: int = 3
    #: row 3: sync_turn calls timed per log size, and turns of sustained ingest per size
    #: (eventsourcing records the same turns)
    sync_calls: int = 2000
    ingest: dict[int, int] = field(default_factory=dict)
    #: row 3: queued turns written to the spill at shutdown
    spill_pending: int = 100_000
    #: row 4: checkpoint sizes (messages of ~1 KB) and repetitions
    checkpoints: tuple[int, ...] = (50, 200, 1000)
    checkpoint_repeats: int = 5
    #: row 6: queries per kind
    queries: int = 200
    #: row 7: re-sent transcript check (sessions x turns)
    resend_turns: int = 200
    #: row 8: facts added through holographic's add_fact at each size
    holo_adds: int = 300
    verify_repeats: int = 3
    verify_es: int = 2000  # turns in the eventsourcing log that row 2 reads back
    #: row 9: new processes per command (and as many of the baseline)
    startup_repeats: int = 21
    #: row 10: leaves of the tree whose consistency proofs are verified, and cosign requests
    witness_leaves: int = 1_000_000
    witness_cosigns: int = 200
    #: row 12: crashes per big log (open after a crash), signed commits, proof verifications
    crash_repeats: int = 3
    commit_repeats: int = 41
    proof_repeats: int = 21


SMOKE = Config(
    name="smoke",
    log_sizes=(2000,),
    append={500: {"one": 50, "many": 200}},
    repeats=1,
    sync_calls=100,
    ingest={500: 100},
    spill_pending=2000,
    checkpoints=(50,),
    checkpoint_repeats=1,
    queries=20,
    resend_turns=20,
    holo_adds=20,
    verify_repeats=1,
    verify_es=200,
    startup_repeats=3,
    witness_leaves=4096,
    witness_cosigns=10,
    crash_repeats=1,
    commit_repeats=5,
    proof_repeats=3,
)

QUICK = Config(
    name="quick",
    log_sizes=(100_000,),
    append={
        500: {"one": 500, "many": 2000},
        10_000: {"one": 120, "many": 300},
    },
    repeats=3,
    sync_calls=1000,
    ingest={500: 800, 10_000: 60},
    checkpoints=(50, 200, 1000),
    checkpoint_repeats=3,
    queries=100,
    resend_turns=100,
    holo_adds=100,
    verify_repeats=1,
    verify_es=5000,
)

FULL = Config(
    name="full",
    log_sizes=(100_000, 1_000_000),
    append={
        500: {"one": 5000, "many": 20000},
        10_000: {"one": 1000, "many": 3000},
    },
    repeats=5,
    sync_calls=3000,
    ingest={500: 4000, 10_000: 400},
    checkpoints=(50, 200, 1000),
    checkpoint_repeats=7,
    queries=500,
    resend_turns=400,
    holo_adds=1000,
    verify_repeats=2,
    verify_es=20000,
    crash_repeats=5,
)

MODES = {"smoke": SMOKE, "quick": QUICK, "full": FULL}
