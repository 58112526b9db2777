"""A gateway-like writer process for the concurrency tests (run as a script).

    python gateway_child.py <home> <tag> <turns> [--delay SECONDS | <checkpoint messages json>]

Drives one provider: ``turns`` turns in session ``<tag>`` (full transcript re-sent each
turn, as hermes does), a memory write and a required checkpoint every few turns, printing
``receipt <line>`` after each checkpoint; with a fourth argument it instead makes that one
checkpoint (for identical checkpoints from several processes at once) after ``go`` on stdin.
"""

from __future__ import annotations

import json
import sys
import time

from archive_provider import ArchiveProvider


def main() -> None:
    home, tag, turns = sys.argv[1], sys.argv[2], int(sys.argv[3])
    provider = ArchiveProvider()
    provider.initialize(tag, hermes_home=home, platform="gateway")
    delay = float(sys.argv[5]) if len(sys.argv) > 5 and sys.argv[4] == "--delay" else 0.0
    if len(sys.argv) > 4 and not delay:
        messages = json.loads(sys.argv[4])
        assert provider.core.writer is not None and provider.core.writer.flush(30)
        print("ready", flush=True)
        sys.stdin.readline()
        print("receipt " + provider.on_pre_compress(messages, require_checkpoint=True), flush=True)
        provider.shutdown()
        return
    messages: list[dict[str, str]] = []
    for n in range(turns):
        time.sleep(delay)  # pace the writes like a gateway's turns, so readers overlap them
        messages += [
            {"role": "user", "content": f"{tag} question {n} about zebras"},
            {"role": "assistant", "content": f"{tag} answer {n}"},
        ]
        provider.sync_turn(
            messages[-2]["content"],
            messages[-1]["content"],
            session_id=tag,
            messages=list(messages),
        )
        if n % 5 == 4:
            provider.on_memory_write("add", "memory", f"{tag} fact {n}", {"session_id": tag})
            print(
                "receipt " + provider.on_pre_compress(list(messages), require_checkpoint=True),
                flush=True,
            )
    provider.shutdown()
    print("done", flush=True)


if __name__ == "__main__":
    main()
