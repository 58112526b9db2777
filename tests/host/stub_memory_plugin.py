"""A recording memory provider, installed as a user-dir plugin by the host tests.

``hostkit.install_memory_plugin`` copies this file to ``$HERMES_HOME/plugins/<name>/__init__.py``
(with a ``stub_config.json`` beside it), so Hermes 0.19.0 discovers it exactly like a real
out-of-tree provider. It records every hook call with its thread, so tests can prove what the
real host calls, in which order and on which thread, without depending on our provider.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent.memory_provider import MemoryProvider

CONFIG_FILE = "stub_config.json"


@dataclass
class Call:
    """One recorded hook call."""

    hook: str
    thread: str
    args: dict[str, Any] = field(default_factory=dict)


class RecordingStubProvider(MemoryProvider):
    """Minimal provider whose every hook appends a :class:`Call` to ``self.calls``."""

    def __init__(
        self,
        name: str = "stubarchive",
        *,
        checkpoint_version: int | None = None,
        system_block: str = "STUB-SYSTEM-BLOCK",
        recall_text: str = "STUB-RECALL-TEXT",
        pre_compress_text: str = "STUB-PRECOMPRESS-RECEIPT",
        tool_name: str | None = None,
    ) -> None:
        self._name = name
        if checkpoint_version is not None:
            self.pre_compress_checkpoint_api_version = checkpoint_version
        self.system_block = system_block
        self.recall_text = recall_text
        self.pre_compress_text = pre_compress_text
        self.tool_name = tool_name or f"{name}_recall"
        self.calls: list[Call] = []
        self._lock = threading.Lock()

    # -- recording helpers -------------------------------------------------

    def _rec(self, hook: str, **args: Any) -> None:
        with self._lock:
            self.calls.append(Call(hook, threading.current_thread().name, args))

    def hooks(self) -> list[str]:
        """Hook names in call order."""
        with self._lock:
            return [c.hook for c in self.calls]

    def of(self, hook: str) -> list[Call]:
        """All calls of one hook, in order."""
        with self._lock:
            return [c for c in self.calls if c.hook == hook]

    # -- MemoryProvider ----------------------------------------------------

    @property
    def name(self) -> str:
        return self._name

    def is_available(self) -> bool:
        return True

    def initialize(self, session_id: str, **kwargs: Any) -> None:
        self._rec("initialize", session_id=session_id, kwargs=dict(kwargs))

    def get_tool_schemas(self) -> list[dict[str, Any]]:
        return [
            {
                "name": self.tool_name,
                "description": "Recall archived conversation snippets (stub).",
                "parameters": {
                    "type": "object",
                    "properties": {"query": {"type": "string"}},
                    "required": ["query"],
                },
            }
        ]

    def handle_tool_call(self, tool_name: str, args: dict[str, Any], **kwargs: Any) -> str:
        self._rec("handle_tool_call", tool_name=tool_name, args=dict(args), kwargs=dict(kwargs))
        return json.dumps({"ok": True, "tool": tool_name, "hits": []})

    def system_prompt_block(self) -> str:
        self._rec("system_prompt_block")
        return self.system_block

    def prefetch(self, query: str, *, session_id: str = "") -> str:
        self._rec("prefetch", query=query, session_id=session_id)
        return self.recall_text

    def queue_prefetch(self, query: str, *, session_id: str = "") -> None:
        self._rec("queue_prefetch", query=query, session_id=session_id)

    def sync_turn(
        self,
        user_content: str,
        assistant_content: str,
        *,
        session_id: str = "",
        messages: list[dict[str, Any]] | None = None,
        **kwargs: Any,
    ) -> None:
        self._rec(
            "sync_turn",
            user=user_content,
            assistant=assistant_content,
            session_id=session_id,
            messages=list(messages) if messages is not None else None,
            kwargs=dict(kwargs),
        )

    def on_turn_start(self, turn_number: int, message: str, **kwargs: Any) -> None:
        self._rec("on_turn_start", turn=turn_number, message=message, kwargs=dict(kwargs))

    def on_session_end(self, messages: list[dict[str, Any]]) -> None:
        self._rec("on_session_end", messages=list(messages))

    def on_session_switch(self, new_session_id: str, **kwargs: Any) -> None:
        self._rec("on_session_switch", new_session_id=new_session_id, kwargs=dict(kwargs))

    def on_pre_compress(
        self, messages: list[dict[str, Any]], *, require_checkpoint: bool = False, **kwargs: Any
    ) -> str:
        self._rec(
            "on_pre_compress",
            messages=list(messages),
            require_checkpoint=require_checkpoint,
            kwargs=dict(kwargs),
        )
        return self.pre_compress_text

    def on_memory_write(
        self,
        action: str,
        target: str,
        content: str,
        metadata: dict[str, Any] | None = None,
    ) -> None:
        self._rec(
            "on_memory_write",
            action=action,
            target=target,
            content=content,
            metadata=metadata,
        )

    def on_delegation(self, task: str, result: str, **kwargs: Any) -> None:
        self._rec("on_delegation", task=task, result=result, kwargs=dict(kwargs))

    def shutdown(self) -> None:
        self._rec("shutdown")


def _load_settings() -> dict[str, Any]:
    path = Path(__file__).with_name(CONFIG_FILE)
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def register(ctx: Any) -> None:
    """Plugin entry point: a fresh instance per call, settings from ``stub_config.json``."""
    settings = _load_settings()
    settings.setdefault("name", Path(__file__).parent.name)
    ctx.register_memory_provider(RecordingStubProvider(**settings))
