"""The main job, end to end: a real Hermes agent archiving into a local profile.

A real hermes-agent ``AIAgent`` runs with the archive provider installed and active,
against the loopback fake LLM (no network, deterministic). Session one introduces a fact
and makes built-in memory writes; a forced compression goes through the real
``compress_context`` (so the provider's checkpoint runs before the compressor); session
two asks about the fact and the archive's recall brings it into the model's request.
Then the log is verified and its timeline printed.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import InvalidRequest
from ..format.verifier import verify_database
from ..host.install import activate, install_plugin
from ..projections.recall import FENCE_OPEN
from ..storage.store import EventStore, archive_dir
from ..storage.witness import Witness
from .fake_llm import FakeLLM, ToolCall

MARKER = ".hermes-archive-demo"
FACT = "BLUE HERON"
SESSION_ONE = [
    f"Hi, I'm Dana. My project codename is {FACT} and it ships on March 3rd.",
    "Please call me Dee from now on.",
    "What is 17 * 23?",
    "Thanks! Let's talk about green tea for a moment.",
]
QUESTION = "What was my project's codename again?"


class DemoRefused(InvalidRequest):
    """The demo will not touch a folder it did not create."""


@dataclass
class DemoResult:
    home: Path
    transcript: list[tuple[str, str, str]] = field(default_factory=list)  # (session, role, text)
    checkpoint_receipt: str = ""
    recall_in_request: str = ""
    answer: str = ""
    verified: dict[str, Any] = field(default_factory=dict)
    timeline: list[dict[str, Any]] = field(default_factory=list)

    @property
    def fact_recalled(self) -> bool:
        return FACT in self.recall_in_request and FACT in self.answer


def fresh_demo_home(home: Path, marker: str, made_by: str) -> None:
    """Empty ``home`` for a demo run; refuse a non-empty folder a demo did not make.

    The witness of the old demo archive goes too: it lives outside the home, and the new
    archive would otherwise be refused as a replaced one (the demo could not run twice).
    """
    if home.exists() and any(home.iterdir()):
        if not (home / marker).exists():
            raise DemoRefused(
                f"{home} is not empty and was not made by the demo; choose another --home"
            )
        shutil.rmtree(home)
        Witness.for_home(home).path.unlink(missing_ok=True)
    home.mkdir(parents=True, exist_ok=True)
    (home / marker).write_text(f"made by `{made_by}`; safe to delete\n")


def prepare_home(home: Path) -> None:
    """A fresh demo profile with the archive installed and active, built-in memory on."""
    fresh_demo_home(home, MARKER, "hermes-archive demo")
    install_plugin(home, "archive")
    activate(home, "archive")
    with (home / "config.yaml").open("a", encoding="utf-8") as config:
        config.write("  memory_enabled: true\n  user_profile_enabled: true\n")


def _question(message: dict[str, Any]) -> str:
    """The user's own words: hermes appends recall as a <memory-context> block."""
    return str(message.get("content") or "").split("<memory-context>")[0]


def scripted_model(body: dict[str, Any]) -> Any:
    """The fake LLM's replies: deterministic, and honest about what reached it."""
    messages = body.get("messages") or []
    if any("TURNS TO SUMMARIZE" in str(m.get("content")) for m in messages):
        return "Summary: Dana (now Dee) introduced herself and a project; we did some arithmetic."
    last = messages[-1] if messages else {}
    if last.get("role") == "tool":
        return "Done, I have noted that."
    question = _question(last)
    if "codename" in question and "again" in question:
        context = str(last.get("content"))
        if FACT in context:
            return f"From the archive: your project codename is {FACT}."
        return "I'm sorry, I don't have that information."
    if "I'm Dana" in question:
        return ToolCall("memory", {"action": "add", "target": "user", "content": "Name: Dana"})
    if "call me Dee" in question:
        return ToolCall(
            "memory",
            {
                "action": "replace",
                "target": "user",
                "old_text": "Name: Dana",
                "content": "Name: Dee (born Dana)",
            },
        )
    if "17 * 23" in question:
        return "17 × 23 = 391."
    return "Happy to."


def _agent(fake: FakeLLM) -> Any:
    from run_agent import AIAgent

    return AIAgent(
        base_url=fake.base_url,
        api_key="sk-demo-offline",
        provider="custom",
        model=fake.model,
        quiet_mode=True,
        skip_context_files=True,
        enabled_toolsets=["memory"],
        tool_delay=0.0,
    )


def run_demo(home: Path, say: Callable[[str], None] = print) -> DemoResult:
    """Run both sessions, compress, verify; returns what happened (also narrated via ``say``)."""
    home = home.resolve()
    prepare_home(home)
    os.environ["HERMES_HOME"] = str(home)
    result = DemoResult(home)
    with FakeLLM(scripted_model) as fake:
        agent = _agent(fake)
        provider = agent._memory_manager.providers[-1]
        say(f"Session 1 ({agent.session_id}), memory provider: {provider.name}")
        messages: list[dict[str, Any]] = []
        for text in SESSION_ONE:
            reply = agent.run_conversation(text, conversation_history=messages)
            messages = reply["messages"]
            result.transcript += [
                (agent.session_id, "user", text),
                (agent.session_id, "agent", reply["final_response"]),
            ]
            say(f"  user>  {text}\n  agent> {reply['final_response']}")
        agent._memory_manager.flush_pending(5)
        result.checkpoint_receipt = _compress(agent, messages)
        say(f"Compression: the provider's checkpoint receipt: {result.checkpoint_receipt}")
        agent.shutdown_memory_provider(messages)

        second = _agent(fake)
        say(f"Session 2 ({second.session_id})")
        reply = second.run_conversation(QUESTION)
        result.answer = reply["final_response"]
        request_text = str(fake.requests[-1]["messages"][-1].get("content"))
        start = request_text.find(FENCE_OPEN)
        result.recall_in_request = (
            request_text[start:].split("</memory-context>")[0].strip() if start >= 0 else ""
        )
        say(f"  user>  {QUESTION}")
        say(
            "  recall that reached the model's request:\n    "
            + result.recall_in_request.replace("\n", "\n    ")
        )
        say(f"  agent> {result.answer}")
        second.shutdown_memory_provider(reply["messages"])
    result.verified, result.timeline = _audit(home)
    return result


def _compress(agent: Any, messages: list[dict[str, Any]]) -> str:
    """Force a compression through the real compress_context; return the receipt it got."""
    from agent.conversation_compression import compress_context

    compressor = agent.context_compressor
    # A short scripted conversation fits in the default protected tail; shrink it so the
    # compressor has a middle to summarize.
    compressor.protect_first_n, compressor.protect_last_n, compressor.tail_token_budget = 1, 2, 64
    receipts: list[str] = []
    original = compressor.compress

    def compress(*args: Any, **kwargs: Any) -> Any:
        receipts.append(str(kwargs.get("memory_context") or ""))
        return original(*args, **kwargs)

    compressor.compress = compress
    try:
        compress_context(
            agent, messages, agent._cached_system_prompt or "", approx_tokens=100_000, force=True
        )
    finally:
        compressor.compress = original
    return receipts[0] if receipts else ""


def _audit(home: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    store = EventStore.open(archive_dir(home), create=False, readonly=True)
    try:
        report = verify_database(store.conn, store.key).as_dict()
        timeline = [
            {
                "seq": e.seq,
                "time": e.time,
                "type": e.type,
                "session": e.session,
                "summary": summarize(store, e.type, e.body),
            }
            for e in store.events()
        ]
    finally:
        store.close()
    return report, timeline


def summarize(store: EventStore, event_type: str, body: Any) -> str:
    """One line a person can read for an event."""

    def part(digest: str) -> Any:
        raw = store.payload(digest)
        return json.loads(raw) if raw else None

    if event_type == "turn":
        rows = [part(d) or {} for d in body["messages"]]
        roles = ", ".join(str(r.get("role")) for r in rows)
        first_user = next((str(r.get("content")) for r in rows if r.get("role") == "user"), "")
        return f"turn {body['turn']}: {len(rows)} messages ({roles}) {first_user[:50]!r}"
    if event_type == "memory_write":
        return f"{body['action']} {body['target']}: {str(part(body['content']))[:60]!r}"
    if event_type == "checkpoint":
        return f"{len(body['evidence'])} evidence messages, digest {body['evidence_digest'][:12]}"
    if event_type == "recall_served":
        return f"recall for turn {body['turn']}: {len(body['sources'])} sources"
    if event_type == "session_switched":
        return f"from {body.get('from')} (reason: {body.get('reason')}, reset: {body.get('reset')})"
    if event_type == "session_ended":
        return f"{body['message_count']} messages in the final transcript"
    if event_type == "session_started":
        return f"platform {body.get('platform')}, hermes {body.get('host')}"
    return ""
