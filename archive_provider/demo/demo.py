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
import sqlite3
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from blake3 import blake3

from ..audit.summary import summary
from ..errors import InvalidRequest
from ..format.verifier import verify_database
from ..host.install import activate, install_plugin
from ..projections.recall import FENCE_OPEN
from ..storage.store import DB_NAME, EventStore, archive_dir, connect
from ..storage.witness import Witness
from .fake_llm import FakeLLM, ToolCall

MANIFEST = ".hermes-archive-demo.json"
_DB_FILES = tuple(DB_NAME + end for end in ("", "-wal", "-shm", "-journal"))
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


def _digest(path: Path) -> str:
    if path.is_symlink():
        return "symlink:" + os.readlink(path)
    hasher = blake3()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            hasher.update(block)
    return hasher.hexdigest()


def _archive_head(folder: Path) -> dict[str, Any]:
    """The store id and head of the archive in ``folder``, read only (or why it cannot be)."""
    try:
        conn = connect(folder / DB_NAME, readonly=True)
        try:
            store = conn.execute("SELECT value FROM meta WHERE name = 'store_id'").fetchone()
            head = conn.execute("SELECT seq, chain FROM head WHERE id = 1").fetchone() or (0, "")
        finally:
            conn.close()
    except sqlite3.Error as exc:
        return {"unreadable": str(exc)}
    chain = head[1].hex() if isinstance(head[1], bytes) else head[1]  # v2 stores 32 bytes
    return {"store_id": store[0] if store else None, "seq": head[0], "chain": chain}


def _inventory(home: Path) -> tuple[dict[str, str], dict[str, dict[str, Any]]]:
    """Every file under ``home`` with its BLAKE3, and every archive with its head.

    An archive's database files (``events.db`` and its ``-wal``/``-shm``/``-journal``) are
    not listed as files: reading an archive may create or change them. Its head stands for
    them, and it only moves when events are appended.
    """
    files: dict[str, str] = {}
    archives: dict[str, dict[str, Any]] = {}
    for folder, dirs, names in os.walk(home):
        base = Path(folder)
        if (base / DB_NAME).is_file() and not (base / DB_NAME).is_symlink():
            archives[base.relative_to(home).as_posix()] = _archive_head(base)
            names = [n for n in names if n not in _DB_FILES]
        for name in names + [d for d in dirs if (base / d).is_symlink()]:
            path = base / name
            relative = path.relative_to(home).as_posix()
            if relative != MANIFEST:
                files[relative] = _digest(path)
    return files, archives


def _write_manifest(home: Path, made_by: str, *, complete: bool) -> None:
    files, archives = _inventory(home) if complete else ({}, {})
    manifest = {
        "made_by": made_by,
        "complete": complete,
        "note": "written by the demo: it deletes only what is listed here, unchanged",
        "files": files,
        "archives": archives,
    }
    partial = home / (MANIFEST + ".partial")
    partial.write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    partial.replace(home / MANIFEST)


def _read_manifest(home: Path) -> dict[str, Any] | None:
    try:
        manifest = json.loads((home / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return manifest if isinstance(manifest, dict) else None


def clear_demo_home(home: Path) -> None:
    """Delete what an earlier demo run made in ``home``, or refuse (DemoRefused).

    Only files listed, unchanged, in the manifest that run wrote are deleted; anything else
    in the folder (a new or changed file, an archive that grew) means the folder is not only
    the demo's any more, and nothing is deleted.
    """
    if not home.exists():
        return
    if not home.is_dir() or home.is_symlink():
        raise DemoRefused(f"{home} is not a folder; choose another --home")
    if not any(home.iterdir()):
        return
    manifest = _read_manifest(home)
    if manifest is None:
        raise DemoRefused(
            f"{home} is not empty and was not made by the demo (no {MANIFEST}); "
            "choose another --home"
        )
    if not manifest.get("complete"):
        raise DemoRefused(
            f"an earlier demo in {home} was stopped before it recorded what it made; "
            "delete the folder yourself or choose another --home"
        )
    made: dict[str, str] = manifest.get("files") or {}
    made_archives: dict[str, Any] = manifest.get("archives") or {}
    files, archives = _inventory(home)
    for folder, head in archives.items():
        if made_archives.get(folder) != head:
            raise DemoRefused(
                f"the archive {home / folder} holds events the demo did not write; "
                "it is never deleted: choose another --home"
            )
    foreign = sorted(name for name, digest in files.items() if made.get(name) != digest)
    if foreign:
        more = f" and {len(foreign) - 1} more" if len(foreign) > 1 else ""
        raise DemoRefused(
            f"{home / foreign[0]}{more} was not made by the demo (or changed since); "
            "nothing was deleted: move it out or choose another --home"
        )
    for name in files:
        (home / name).unlink()
    for folder in archives:
        for name in _DB_FILES:
            (home / folder / name).unlink(missing_ok=True)
    (home / MANIFEST).unlink()
    for folder, _, _ in sorted(os.walk(home), key=lambda entry: -len(entry[0])):
        if Path(folder) != home and not any(Path(folder).iterdir()):
            Path(folder).rmdir()
    # the witness of the old demo archive lives outside the home; the new archive would
    # otherwise be refused as a replaced one (the demo could not run twice)
    if "archive" in archives:
        Witness.for_home(home).path.unlink(missing_ok=True)


@contextmanager
def demo_home(home: Path, made_by: str) -> Iterator[None]:
    """Run the body in a fresh demo folder; afterwards record every file it made.

    The record is written even when the body fails, so a failed run can be cleared too;
    only a killed run leaves the in-progress record, and then the next run refuses.
    """
    clear_demo_home(home)
    home.mkdir(parents=True, exist_ok=True)
    _write_manifest(home, made_by, complete=False)
    try:
        yield
    finally:
        _write_manifest(home, made_by, complete=True)


def prepare_home(home: Path) -> None:
    """The demo profile with the archive installed and active, built-in memory on."""
    install_plugin(home, "archive")
    activate(home, "archive")
    with (home / "config.yaml").open("a", encoding="utf-8") as config:
        config.write("  memory_enabled: true\n  user_profile_enabled: true\n")


def _question(message: dict[str, Any]) -> str:
    """The user's own words: hermes appends recall as a <memory-context> block."""
    return str(message.get("content") or "").split("<memory-context>")[0]


def _memory_actions(body: dict[str, Any]) -> list[str]:
    """The actions the host's ``memory`` tool offers the model in this request."""
    for tool in body.get("tools") or []:
        function = tool.get("function") or {}
        if function.get("name") == "memory":
            action = (function.get("parameters") or {}).get("properties", {}).get("action", {})
            return list(action.get("enum") or [])
    return []


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
        if "patch" in _memory_actions(body):  # 0.22 offers patch (a span), 0.19.0 replace
            edit = {"action": "patch", "old_text": "Dana", "content": "Dee (born Dana)"}
        else:
            edit = {
                "action": "replace",
                "old_text": "Name: Dana",
                "content": "Name: Dee (born Dana)",
            }
        return ToolCall("memory", {**edit, "target": "user"})
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
    with demo_home(home, "hermes-archive demo"):
        return _run(home, say)


def _run(home: Path, say: Callable[[str], None]) -> DemoResult:
    prepare_home(home)
    os.environ["HERMES_HOME"] = str(home)
    result = DemoResult(home)
    with FakeLLM(scripted_model) as fake:
        agent = _agent(fake)
        provider = agent._memory_manager.providers[-1]
        say(
            f"The model is a scripted stand-in LLM at {fake.base_url} (local, deterministic; "
            "no network, no API key)"
        )
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
                "summary": summary(store, e),
            }
            for e in store.events()
        ]
    finally:
        store.close()
    return report, timeline
