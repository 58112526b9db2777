"""Child processes for the crash and fsync tests (run as scripts, not collected by pytest).

``python crash_child.py zygote``
    Imports everything, then serves commands on stdin so that each worker starts by
    ``fork()`` in milliseconds (no threads exist before the fork):
    ``go <home> <seed>`` forks a worker and answers ``pid <pid>``;
    ``reap <pid>`` waits for it (the test has SIGKILLed it) and answers ``dead <pid> <status>``,
    so every line the worker wrote is in the pipe before that answer; ``quit`` ends.
    A worker drives an ArchiveProvider forever: turns, memory writes and required
    checkpoints, printing ``receipt <pid> <receipt line>`` right after each checkpoint returns.

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
    else:
        raise SystemExit(f"unknown mode {sys.argv[1]!r}")
