"""What hivemind's issue-21 paths cost: one peer summary (model vs extractive), one sync
that backfills a timeline gap (vs a sync with no gap), and one checkpoint witnessed by a
peer over an encrypted room (messages, bytes on the homeserver, time), on loopback servers.

Run: ``python -m bench.hivemind_costs`` (starts a throw-away Synapse and the fake LLM). The
absolute times drift on a shared machine; the ratios and the counts (requests, bytes) hold.
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from archive_provider.demo.fake_llm import FakeLLM
from archive_provider.format.events import Hasher
from hivemind import matrix_backend
from hivemind.homeserver import Homeserver
from hivemind.matrix_backend import MatrixBackend
from hivemind.settings import HivemindSettings
from hivemind.summarizer import HourlyBudget, SummaryRequest, host_model, summary_event

MESSAGES = [
    f"Note {i}: we verify TEE attestation reports against the vendor root." for i in range(20)
]


def _median_ms(run: Callable[[], Any], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        run()
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def summary_costs(work: Path, repeat: int = 20) -> dict[str, Any]:
    """Median time of one summary each way, and the bytes of the prompt a model receives."""
    os.environ["HERMES_HOME"] = str(work)
    request = SummaryRequest("@p:localhost", tuple(f"$e{i}" for i in range(20)), tuple(MESSAGES))
    hasher = Hasher(bytes(32))
    with FakeLLM(lambda body: "Verifies TEE attestation reports.") as fake:
        config = {
            "auxiliary": {
                "hivemind_summary": {
                    "provider": "custom",
                    "model": fake.model,
                    "base_url": fake.base_url,
                    "api_key": "x",
                }
            }
        }
        (work / "config.yaml").write_text(yaml.safe_dump(config))
        ask = host_model(HivemindSettings())

        def llm() -> None:
            event = summary_event(hasher, request, ask, HourlyBudget(10**6), 4000)
            assert event.body["method"] == "llm"

        def extractive() -> None:
            event = summary_event(hasher, request, ask, HourlyBudget(0), 4000)
            assert event.body["method"] == "extractive"

        llm_ms, extractive_ms = _median_ms(llm, repeat), _median_ms(extractive, repeat)
        body = fake.requests[-1]
        prompt_bytes = sum(len(m["content"].encode()) for m in body["messages"])
    return {"llm_ms": llm_ms, "extractive_ms": extractive_ms, "prompt_bytes": prompt_bytes}


def backfill_costs(work: Path, gap: int = 50, limit: int = 10) -> dict[str, Any]:
    """One sync after ``gap`` messages with a timeline of ``limit`` vs one after ``limit``."""
    (work / "synapse").mkdir()
    hs = Homeserver(work / "synapse")
    hs.start()
    backends: list[MatrixBackend] = []
    try:
        users = [hs.register(f"{name}{os.getpid()}", "pw-bench-1") for name in ("alice", "bob")]
        for user, extra in zip(users, ({}, {"timeline_limit": limit}), strict=True):
            backend = MatrixBackend(
                hs.base_url,
                user["user_id"],
                work / user["user_id"][1:8],
                access_token=user["access_token"],
                device_id=user["device_id"],
                **extra,
            )
            backend.start()
            backends.append(backend)
        a, b = backends
        room = a.direct_room_for(users[1]["user_id"])
        deadline = time.monotonic() + 15
        while room not in b.joined_rooms() and time.monotonic() < deadline:
            b.sync(500)
        b.sync(0)
        pages: list[int] = []
        original = b._nio.room_messages

        async def counted(*args: Any, **kwargs: Any) -> Any:
            pages.append(1)
            return await original(*args, **kwargs)

        b._nio.room_messages = counted  # type: ignore[method-assign]
        for i in range(limit):
            a.send_text(room, f"small {i}")
        start = time.perf_counter()
        plain = b.sync(0)
        plain_ms = (time.perf_counter() - start) * 1000
        for i in range(gap):
            a.send_text(room, f"gap {i}")
        start = time.perf_counter()
        filled = b.sync(0)
        filled_ms = (time.perf_counter() - start) * 1000
        assert len(filled.messages) == gap and not filled.unfilled_rooms
        assert len(plain.messages) == limit
    finally:
        for backend in backends:
            backend.close()
        hs.stop()
    return {
        "gap": gap,
        "limit": limit,
        "requests": len(pages),
        "page_size": matrix_backend.BACKFILL_PAGE,
        "plain_ms": plain_ms,
        "filled_ms": filled_ms,
    }


def _wait_witness(backend: MatrixBackend) -> tuple[Any, ...]:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        found = backend.sync(200).witness
        if found:
            return found
    raise AssertionError("no witness message within 30 s")


def witness_costs(work: Path, rounds: int = 10) -> dict[str, Any]:
    """Alice's checkpoints cosigned by Bob over their encrypted room, with the glue hivemind
    runs (``PeerWitnessing``): per checkpoint, the messages, their size as the homeserver
    stores them (Megolm ciphertext events) and the time of each side's work."""
    from archive_provider.storage.store import EventStore, archive_dir
    from archive_provider.storage.witness import Witness
    from archive_provider.storage.writer import Writer
    from hivemind.witnessing import PeerWitnessing

    (work / "synapse-w").mkdir()
    hs = Homeserver(work / "synapse-w")
    hs.start()
    backends: list[MatrixBackend] = []
    writer = None
    sides: list[PeerWitnessing] = []
    try:
        users = [hs.register(f"{n}w{os.getpid()}", "pw-bench-1") for n in ("alice", "bob")]
        for user in users:
            backend = MatrixBackend(
                hs.base_url,
                user["user_id"],
                work / ("crypto-w-" + user["user_id"][1:6]),
                access_token=user["access_token"],
                device_id=user["device_id"],
            )
            backend.start()
            backends.append(backend)
        a, b = backends
        alice, bob = (u["user_id"] for u in users)
        room = a.direct_room_for(bob)
        deadline = time.monotonic() + 15
        while room not in b.joined_rooms() and time.monotonic() < deadline:
            b.sync(500)
        home_a, home_b = work / "alice-home", work / "bob-home"
        EventStore.open(archive_dir(home_a)).close()
        writer = Writer(archive_dir(home_a), witness=Witness.for_home(home_a))
        submit = lambda build, label: writer.submit(build, label=label)  # noqa: E731
        alice_side = PeerWitnessing(
            home=home_a, user_id=alice, peers=[bob], interval_s=0, submit=submit
        )
        bob_side = PeerWitnessing(
            home=home_b, user_id=bob, peers=[alice], interval_s=0, submit=submit
        )
        sides = [alice_side, bob_side]
        send_ms, judge_ms, accept_ms, total_ms = [], [], [], []
        for turn in range(rounds + 1):

            def build(store: EventStore, t: int = turn) -> list[Any]:
                from archive_provider.format.events import NewEvent

                part = store.hasher.part({"content": f"turn {t}", "role": "user"})
                body = {"turn": t, "messages": [part.digest]}
                return [NewEvent("turn", "s1", {"turn": t}, body, (part,))]

            writer.append_durable(build, timeout=30)  # a durable commit signs a checkpoint
            start = time.perf_counter()
            alice_side.send_due(a)
            sent = time.perf_counter()
            requests = _wait_witness(b)
            judging = time.perf_counter()
            bob_side.handle(b, requests)
            judged = time.perf_counter()
            answers = _wait_witness(a)
            accepting = time.perf_counter()
            alice_side.handle(a, answers)
            done = time.perf_counter()
            if turn:  # the first round also creates the peer witness entry: not counted
                send_ms.append((sent - start) * 1000)
                judge_ms.append((judged - judging) * 1000)
                accept_ms.append((done - accepting) * 1000)
                total_ms.append((done - start) * 1000)
        writer.flush(30)
        stored = hs.client_api(
            users[0]["access_token"],
            "GET",
            f"/_matrix/client/v3/rooms/{room}/messages?dir=b&limit={2 * rounds}",
        )["chunk"]
        sizes: dict[str, list[int]] = {alice: [], bob: []}
        for event in stored:
            if event.get("type") == "m.room.encrypted":
                sizes[event["sender"]].append(len(json.dumps(event["content"])))
        cosigned = EventStore.open(archive_dir(home_a), create=False, readonly=True)
        kept = cosigned.conn.execute(
            "SELECT count(*) FROM cosignatures WHERE name LIKE 'hivemind.peer-witness/%'"
        ).fetchone()[0]
        cosigned.close()
        assert kept == rounds + 1, kept
    finally:
        for side in sides:
            side.close()
        if writer is not None:
            writer.close()
        for backend in backends:
            backend.close()
        hs.stop()
    return {
        "rounds": rounds,
        "messages": 2,
        "request_bytes": statistics.median(sizes[alice]),
        "answer_bytes": statistics.median(sizes[bob]),
        "send_ms": statistics.median(send_ms),
        "judge_ms": statistics.median(judge_ms),
        "accept_ms": statistics.median(accept_ms),
        "total_ms": statistics.median(total_ms),
    }


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        summary = summary_costs(Path(tmp))
        backfill = backfill_costs(Path(tmp))
        witness = witness_costs(Path(tmp))
    print(f"summary, model (call_llm -> loopback fake LLM): {summary['llm_ms']:.1f} ms median")
    print(
        f"summary, extractive (no model):                 {summary['extractive_ms']:.2f} ms median"
    )
    print(
        f"  ratio model/extractive: {summary['llm_ms'] / summary['extractive_ms']:.0f}x;"
        f" prompt: {summary['prompt_bytes']} bytes for 20 messages"
    )
    print(
        f"sync with a {backfill['gap']}-message gap (timeline {backfill['limit']}):"
        f" {backfill['filled_ms']:.1f} ms, {backfill['requests']} /messages request(s)"
    )
    print(
        f"sync with {backfill['limit']} messages, no gap: {backfill['plain_ms']:.1f} ms;"
        f" ratio {backfill['filled_ms'] / backfill['plain_ms']:.1f}x"
    )
    print(
        f"one checkpoint witnessed by a peer: {witness['messages']} messages "
        f"(request {witness['request_bytes']:.0f} B, answer {witness['answer_bytes']:.0f} B "
        f"as stored encrypted); {witness['total_ms']:.1f} ms end to end (median of "
        f"{witness['rounds']}): send {witness['send_ms']:.1f} ms, judge and answer "
        f"{witness['judge_ms']:.1f} ms, accept {witness['accept_ms']:.1f} ms"
    )


if __name__ == "__main__":
    main()
