"""Child processes for the crash and fsync tests (run as scripts, not collected by pytest).

``python crash_child.py zygote``
    Imports everything, then serves commands on stdin so that each worker starts by
    ``fork()`` in milliseconds (no threads exist before the fork):
    ``go <home> <seed>`` forks a worker and answers ``pid <pid>``;
    ``reap <pid>`` waits for it (the test has SIGKILLed it) and answers ``dead <pid> <status>``,
    so every line the worker wrote is in the pipe before that answer; ``quit`` ends.
    A worker drives an ArchiveProvider forever: turns, memory writes and required
    checkpoints, printing ``receipt <pid> <receipt line>`` right after each checkpoint returns.

``spill <home> <seed> <journal>`` (to the zygote) forks a worker that drives turns (whole
    transcripts, several sessions), memory writes and required checkpoints with a small
    queue bound, ``journal_every_event`` on or off, printing ``accepted <pid> <session>
    <turn>`` right after each ``sync_turn`` returns and a receipt after each checkpoint.

``python crash_child.py burst <home> <turns> <sessions>``
    The burst of issue 20: ``turns`` back-to-back turns with whole transcripts, then an
    ordinary shutdown; prints ``burst <spilled> <max queued events> <bound>``.

``python crash_child.py strace <home>``
    One provider; writes ``TURN-BEGIN``/``TURN-END`` around a flushed ``sync_turn`` and
    ``CKPT-BEGIN``/``CKPT-END`` around a required checkpoint, to stderr with single
    ``write(2)`` calls, so ``strace -f -y -e trace=fsync,fdatasync,write`` shows whether the
    database or its WAL was synced between the markers.
"""

from __future__ import annotations

import os
import random
import sys
import threading

from archive_provider import ArchiveProvider


def say(line: str, fd: int = 1) -> None:
    os.write(fd, (line + "\n").encode("utf-8", "surrogateescape"))


def worker(home: str, seed: int) -> None:
    rng = random.Random(seed)
    provider = ArchiveProvider()
    session = f"w{seed}"
    provider.initialize(session, hermes_home=home, platform="cli", agent_context="primary")
    messages: list[dict[str, object]] = [{"role": "system", "content": "sys"}]
    turn = 0
    while True:
        turn += 1
        user = f"user {seed}/{turn} " + "x" * rng.randrange(0, 400)
        messages += [
            {"role": "user", "content": user},
            {"role": "assistant", "content": f"answer {seed}/{turn}"},
        ]
        provider.on_turn_start(turn, user)
        provider.sync_turn(
            user, f"answer {seed}/{turn}", session_id=session, messages=list(messages)
        )
        if rng.random() < 0.5:
            provider.on_memory_write(
                "add", "memory", f"fact {seed}/{turn}", {"session_id": session}
            )
        receipt = provider.on_pre_compress(list(messages), require_checkpoint=True)
        say(f"receipt {os.getpid()} {receipt}")


def spill_worker(home: str, seed: int, journal: bool) -> None:
    os.environ["ARCHIVE_QUEUE_MAX_EVENTS"] = "40"
    os.environ["ARCHIVE_JOURNAL_EVERY_EVENT"] = "true" if journal else "false"
    rng = random.Random(seed)
    provider = ArchiveProvider()
    provider.initialize(f"k{seed}", hermes_home=home, platform="cli", agent_context="primary")
    transcripts: dict[str, list[dict[str, object]]] = {}
    turn = 0
    while True:
        turn += 1
        session = f"k{seed}-{turn % 3}"
        messages = transcripts.setdefault(session, [{"role": "system", "content": "sys"}])
        user = f"user {session} {turn} " + "x" * rng.randrange(0, 300)
        messages += [
            {"role": "user", "content": user},
            {"role": "assistant", "content": f"answer {session} {turn}"},
        ]
        provider.sync_turn(user, "answer", session_id=session, messages=list(messages))
        say(f"accepted {os.getpid()} {session} {turn}")
        if rng.random() < 0.02:
            receipt = provider.on_pre_compress(list(messages), require_checkpoint=True)
            say(f"receipt {os.getpid()} {receipt}")


def burst(home: str, turns: int, sessions: int) -> None:
    provider = ArchiveProvider()
    provider.initialize("burst", hermes_home=home, platform="cli", agent_context="primary")
    writer = provider.core.writer
    assert writer is not None
    transcripts: dict[str, list[dict[str, object]]] = {}
    most = 0
    for turn in range(turns):
        session = f"b{turn % sessions}"
        messages = transcripts.setdefault(session, [{"role": "system", "content": "sys"}])
        user = f"user {session} {turn}"
        messages += [
            {"role": "user", "content": user},
            {"role": "assistant", "content": f"answer {session} {turn} " + "y" * 300},
        ]
        provider.sync_turn(user, "answer", session_id=session, messages=list(messages))
        most = max(most, writer.queued_events)
    spilled = writer.spilled
    provider.shutdown()
    say(f"burst {spilled} {most} {writer._max_events}")


def zygote() -> None:
    assert threading.active_count() == 1, "the zygote must not start threads before fork()"
    say("ready")
    for line in sys.stdin:
        words = line.split()
        if not words:
            continue
        if words[0] == "go":
            home, seed = words[1], int(words[2])
            pid = os.fork()
            if pid == 0:  # the worker
                try:
                    worker(home, seed)
                finally:
                    os._exit(3)
            say(f"pid {pid}")
        elif words[0] == "spill":
            home, seed, journal = words[1], int(words[2]), words[3] == "1"
            pid = os.fork()
            if pid == 0:
                try:
                    spill_worker(home, seed, journal)
                finally:
                    os._exit(3)
            say(f"pid {pid}")
        elif words[0] == "reap":
            pid = int(words[1])
            _, status = os.waitpid(pid, 0)
            say(f"dead {pid} {status}")
        elif words[0] == "quit":
            return


def strace_run(home: str) -> None:
    provider = ArchiveProvider()
    provider.initialize("s1", hermes_home=home, platform="cli")
    messages = [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "hi"}]
    provider.sync_turn("hello", "hi", session_id="s1", messages=messages)
    assert provider.core.writer is not None and provider.core.writer.flush(
        30
    )  # open and prove first
    # a first checkpoint witnesses the store (its seq-0 witness record is written before
    # that commit, by design: it claims no head); the traced one below is an ordinary one
    assert provider.on_pre_compress(messages, require_checkpoint=True)
    more = messages + [{"role": "user", "content": "again"}, {"role": "assistant", "content": "ok"}]
    say("TURN-BEGIN", 2)
    provider.sync_turn("again", "ok", session_id="s1", messages=more)
    assert provider.core.writer.flush(30)
    say("TURN-END", 2)
    say("CKPT-BEGIN", 2)
    receipt = provider.on_pre_compress(more, require_checkpoint=True)
    say("CKPT-END", 2)
    say(f"receipt {receipt}")
    provider.shutdown()


if __name__ == "__main__":
    if sys.argv[1] == "zygote":
        zygote()
    elif sys.argv[1] == "strace":
        strace_run(sys.argv[2])
    elif sys.argv[1] == "burst":
        burst(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
    else:
        raise SystemExit(f"unknown mode {sys.argv[1]!r}")
