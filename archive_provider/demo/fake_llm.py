"""A tiny scripted OpenAI-compatible server on loopback.

Why it exists: the real Hermes host (``AIAgent.run_conversation``) needs an LLM endpoint,
and tests plus the ``hermes-archive demo`` command must run offline and deterministically.
This server speaks just enough of the OpenAI HTTP API for the ``openai`` client the host
uses:

* ``GET  /v1/models``            one model entry carrying ``context_length``;
* ``POST /v1/chat/completions``  plain JSON, or SSE when ``"stream": true``
  (``chat.completion.chunk`` deltas, a final chunk carrying ``usage``, then ``[DONE]``).

Replies come from a *script*: a list consumed in order, or a callable
``reply(request_json) -> reply``. A reply is a ``str`` (assistant text), a :class:`Reply`,
a :class:`ToolCall` or list of them, a ``dict`` shaped like ``{"content": ..., "tool_calls":
[...]}``, or an :class:`ErrorReply`. Every request body is recorded so tests can assert what
actually reached the model (system prompt, injected recall, tool schemas).

Standard library only, and nothing from hermes: it is imported by tests and by the demo.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = [
    "ErrorReply",
    "FakeLLM",
    "RecordedRequest",
    "Reply",
    "ToolCall",
]

DEFAULT_MODEL = "fake-archive-model"
DEFAULT_CONTEXT_LENGTH = 131_072


@dataclass
class ToolCall:
    """One function call the fake model asks the host to run."""

    name: str
    arguments: dict[str, Any] | str = field(default_factory=dict)
    id: str | None = None

    def to_openai(self, index: int) -> dict[str, Any]:
        args = self.arguments
        if not isinstance(args, str):
            args = json.dumps(args, ensure_ascii=False)
        return {
            "id": self.id or f"call_{uuid.uuid4().hex[:12]}",
            "type": "function",
            "function": {"name": self.name, "arguments": args},
            "index": index,
        }


@dataclass
class Reply:
    """A scripted assistant message: text, tool calls, or both."""

    content: str | None = None
    tool_calls: list[ToolCall] = field(default_factory=list)
    finish_reason: str | None = None
    delay: float = 0.0

    @property
    def resolved_finish_reason(self) -> str:
        if self.finish_reason:
            return self.finish_reason
        return "tool_calls" if self.tool_calls else "stop"


@dataclass
class ErrorReply:
    """Answer the request with an HTTP error (to exercise host retry/failure paths)."""

    status: int = 500
    message: str = "fake llm error"
    error_type: str = "server_error"


@dataclass
class RecordedRequest:
    """What one HTTP request carried, as the server saw it."""

    method: str
    path: str
    headers: dict[str, str]
    body: Any
    time: float


ReplyLike = Any  # str | Reply | ToolCall | list[ToolCall] | dict | ErrorReply | None
Script = list[ReplyLike] | Callable[[dict[str, Any]], ReplyLike]


def _coerce_reply(value: ReplyLike, default: str) -> Reply | ErrorReply:
    """Normalize every accepted reply shape into a :class:`Reply` (or an error)."""
    if value is None:
        return Reply(content=default)
    if isinstance(value, (Reply, ErrorReply)):
        return value
    if isinstance(value, str):
        return Reply(content=value)
    if isinstance(value, ToolCall):
        return Reply(tool_calls=[value])
    if isinstance(value, (list, tuple)) and all(isinstance(v, ToolCall) for v in value):
        return Reply(tool_calls=list(value))
    if isinstance(value, dict):
        calls = []
        for raw in value.get("tool_calls") or []:
            if isinstance(raw, ToolCall):
                calls.append(raw)
                continue
            fn = raw.get("function", raw)
            calls.append(ToolCall(fn["name"], fn.get("arguments", {}), raw.get("id")))
        return Reply(
            content=value.get("content"),
            tool_calls=calls,
            finish_reason=value.get("finish_reason"),
            delay=float(value.get("delay", 0.0)),
        )
    raise TypeError(f"unsupported fake LLM reply: {value!r}")


def _approx_tokens(obj: Any) -> int:
    """Rough token count (4 chars per token); the host only needs plausible numbers."""
    try:
        text = json.dumps(obj, ensure_ascii=False)
    except (TypeError, ValueError):
        text = str(obj)
    return max(1, len(text) // 4)


def _text_of(content: Any) -> str:
    """Flatten OpenAI message content (string or list of parts) to text."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            str(p.get("text", "")) for p in content if isinstance(p, dict) and "text" in p
        )
    return ""


class FakeLLM:
    """Scripted OpenAI-compatible endpoint bound to 127.0.0.1 on a free port.

    Use as a context manager, or call :meth:`start` / :meth:`stop`. Point clients at
    :attr:`base_url` (which ends in ``/v1``).
    """

    def __init__(
        self,
        script: Script | None = None,
        *,
        model: str = DEFAULT_MODEL,
        context_length: int = DEFAULT_CONTEXT_LENGTH,
        default_reply: str = "OK.",
        host: str = "127.0.0.1",
        port: int = 0,
        stream_chunk_chars: int = 8,
    ) -> None:
        self.model = model
        self.context_length = int(context_length)
        self.default_reply = default_reply
        self.stream_chunk_chars = max(1, int(stream_chunk_chars))
        self._host = host
        self._port = port
        self._lock = threading.Lock()
        self._script: list[ReplyLike] = []
        self._responder: Callable[[dict[str, Any]], ReplyLike] | None = None
        self.set_script(script)
        self.log: list[RecordedRequest] = []
        self.requests: list[dict[str, Any]] = []
        self.unhandled: list[RecordedRequest] = []
        self.exhausted = 0
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._ids = itertools.count(1)

    # -- script ------------------------------------------------------------

    def set_script(self, script: Script | None) -> None:
        """Replace the script: a list consumed in order, or a responder callable."""
        with self._lock:
            if callable(script):
                self._responder = script
                self._script = []
            else:
                self._responder = None
                self._script = list(script or [])

    def push(self, *replies: ReplyLike) -> None:
        """Append replies to a list script (the next requests consume them in order)."""
        with self._lock:
            self._script.extend(replies)

    @property
    def pending(self) -> int:
        """How many scripted replies have not been consumed yet."""
        with self._lock:
            return len(self._script)

    def _next_reply(self, body: dict[str, Any]) -> Reply | ErrorReply:
        with self._lock:
            responder = self._responder
            if responder is None:
                if self._script:
                    raw = self._script.pop(0)
                else:
                    self.exhausted += 1
                    raw = None
        if responder is not None:
            raw = responder(body)
        return _coerce_reply(raw, self.default_reply)

    # -- lifecycle ---------------------------------------------------------

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("FakeLLM is not started")
        return int(self._server.server_address[1])

    @property
    def base_url(self) -> str:
        """OpenAI-style base URL, e.g. ``http://127.0.0.1:43123/v1``."""
        return f"http://{self._host}:{self.port}/v1"

    def start(self) -> FakeLLM:
        """Bind and serve on a daemon thread; returns self for chaining."""
        if self._server is not None:
            return self
        handler = _make_handler(self)
        server = ThreadingHTTPServer((self._host, self._port), handler)
        server.daemon_threads = True
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever,
            kwargs={"poll_interval": 0.05},
            name=f"fake-llm-{self.port}",
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and close the socket (idempotent)."""
        server, self._server = self._server, None
        if server is None:
            return
        server.shutdown()
        server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def __enter__(self) -> FakeLLM:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- recorded traffic helpers -----------------------------------------

    @property
    def last_request(self) -> dict[str, Any]:
        with self._lock:
            if not self.requests:
                raise AssertionError("the fake LLM has received no chat request")
            return self.requests[-1]

    @staticmethod
    def system_prompt(request: dict[str, Any]) -> str:
        """Concatenated text of the request's system messages."""
        return "\n".join(
            _text_of(m.get("content"))
            for m in request.get("messages", [])
            if m.get("role") == "system"
        )

    @staticmethod
    def user_texts(request: dict[str, Any]) -> list[str]:
        """Text of each user message in the request, in order."""
        return [
            _text_of(m.get("content"))
            for m in request.get("messages", [])
            if m.get("role") == "user"
        ]

    @staticmethod
    def tool_names(request: dict[str, Any]) -> list[str]:
        """Names of the tools advertised in the request."""
        names = []
        for tool in request.get("tools") or []:
            fn = tool.get("function", tool) if isinstance(tool, dict) else {}
            if fn.get("name"):
                names.append(fn["name"])
        return names

    def wait_for_requests(self, count: int, timeout: float = 5.0) -> bool:
        """Block until ``count`` chat requests arrived (for background host calls)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                if len(self.requests) >= count:
                    return True
            time.sleep(0.01)
        return False

    # -- response builders (called from handler threads) ------------------

    def _record(self, method: str, path: str, headers: Any, body: Any) -> RecordedRequest:
        rec = RecordedRequest(method, path, dict(headers.items()), body, time.time())
        with self._lock:
            self.log.append(rec)
        return rec

    def _completion_id(self) -> str:
        return f"chatcmpl-fake-{next(self._ids)}"

    def _usage(self, body: dict[str, Any], reply: Reply) -> dict[str, int]:
        prompt = _approx_tokens(body.get("messages", [])) + _approx_tokens(body.get("tools", []))
        completion = _approx_tokens(reply.content or "") + sum(
            _approx_tokens(tc.arguments) for tc in reply.tool_calls
        )
        return {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        }

    def _models_payload(self) -> dict[str, Any]:
        return {
            "object": "list",
            "data": [
                {
                    "id": self.model,
                    "object": "model",
                    "created": 0,
                    "owned_by": "hermes-archive-fake",
                    "context_length": self.context_length,
                    "max_model_len": self.context_length,
                }
            ],
        }

    def _completion_payload(self, body: dict[str, Any], reply: Reply) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": reply.content}
        if reply.tool_calls:
            message["tool_calls"] = [
                {k: v for k, v in tc.to_openai(i).items() if k != "index"}
                for i, tc in enumerate(reply.tool_calls)
            ]
        return {
            "id": self._completion_id(),
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model") or self.model,
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "finish_reason": reply.resolved_finish_reason,
                    "logprobs": None,
                }
            ],
            "usage": self._usage(body, reply),
        }

    def _stream_chunks(self, body: dict[str, Any], reply: Reply) -> Iterator[dict[str, Any]]:
        cid = self._completion_id()
        created = int(time.time())
        model = body.get("model") or self.model

        def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
            return {
                "id": cid,
                "object": "chat.completion.chunk",
                "created": created,
                "model": model,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
            }

        yield chunk({"role": "assistant", "content": ""})
        text = reply.content or ""
        step = self.stream_chunk_chars
        for start in range(0, len(text), step):
            yield chunk({"content": text[start : start + step]})
        for i, tc in enumerate(reply.tool_calls):
            full = tc.to_openai(i)
            args = full["function"]["arguments"]
            head = {
                "index": i,
                "id": full["id"],
                "type": "function",
                "function": {"name": tc.name, "arguments": ""},
            }
            yield chunk({"tool_calls": [head]})
            for start in range(0, len(args), max(step, 16)):
                part = {"index": i, "function": {"arguments": args[start : start + max(step, 16)]}}
                yield chunk({"tool_calls": [part]})
        yield chunk({}, reply.resolved_finish_reason)
        final: dict[str, Any] = {
            "id": cid,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "choices": [],
            "usage": self._usage(body, reply),
        }
        yield final


def _make_handler(fake: FakeLLM) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "FakeLLM/1"

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib name
            return  # keep test output clean

        def _send_json(self, status: int, payload: Any) -> None:
            data = json.dumps(payload).encode("utf-8")
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _route(self) -> str:
            path = self.path.split("?", 1)[0].rstrip("/")
            return path[3:] if path.startswith("/v1") else path

        def do_GET(self) -> None:  # noqa: N802 - stdlib API
            rec = fake._record("GET", self.path, self.headers, None)
            route = self._route()
            if route == "/models":
                self._send_json(200, fake._models_payload())
            elif route == f"/models/{fake.model}":
                self._send_json(200, fake._models_payload()["data"][0])
            else:
                with fake._lock:
                    fake.unhandled.append(rec)
                self._send_json(404, {"error": {"message": "not found", "type": "not_found"}})

        def do_POST(self) -> None:  # noqa: N802 - stdlib API
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            try:
                body = json.loads(raw or b"{}")
            except ValueError:
                body = {"_unparsed": raw.decode("utf-8", "replace")}
            rec = fake._record("POST", self.path, self.headers, body)
            if self._route() != "/chat/completions":
                with fake._lock:
                    fake.unhandled.append(rec)
                self._send_json(404, {"error": {"message": "not found", "type": "not_found"}})
                return
            with fake._lock:
                fake.requests.append(body)
            try:
                reply = fake._next_reply(body)
            except Exception as exc:  # a broken responder must not hang the host
                reply = ErrorReply(500, f"fake llm responder failed: {exc!r}")
            if isinstance(reply, ErrorReply):
                self._send_json(
                    reply.status,
                    {"error": {"message": reply.message, "type": reply.error_type}},
                )
                return
            if reply.delay:
                time.sleep(reply.delay)
            if body.get("stream"):
                self._stream(body, reply)
            else:
                self._send_json(200, fake._completion_payload(body, reply))

        def _stream(self, body: dict[str, Any], reply: Reply) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-cache")
            self.send_header("Connection", "close")
            self.end_headers()
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                for event in fake._stream_chunks(body, reply):
                    self.wfile.write(f"data: {json.dumps(event)}\n\n".encode())
                    self.wfile.flush()
                self.wfile.write(b"data: [DONE]\n\n")
                self.wfile.flush()
            self.close_connection = True

    return Handler


def main(argv: list[str] | None = None) -> int:
    """Serve an echoing fake model until interrupted (handy for manual host runs)."""
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--model", default=DEFAULT_MODEL)
    args = parser.parse_args(argv)

    def echo(request: dict[str, Any]) -> str:
        users = FakeLLM.user_texts(request)
        return f"(fake) you said: {users[-1][:200]}" if users else "(fake) hello"

    with FakeLLM(echo, model=args.model, port=args.port) as fake:
        print(fake.base_url, flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            while True:
                time.sleep(3600)
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
