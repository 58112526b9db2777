"""What hivemind's issue-21 paths cost: one peer summary (model vs extractive) and one sync
that backfills a timeline gap (vs a sync with no gap), on loopback servers.

Run: ``python -m bench.hivemind_costs`` (starts a throw-away Synapse and the fake LLM). The
absolute times drift on a shared machine; the ratios and the counts (requests, bytes) hold.
"""

from __future__ import annotations

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


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        summary = summary_costs(Path(tmp))
        backfill = backfill_costs(Path(tmp))
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


if __name__ == "__main__":
    main()
