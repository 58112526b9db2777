"""The loopback fake LLM speaks enough OpenAI for the ``openai`` client the host uses."""

from __future__ import annotations

import json
import socket
import urllib.request

import openai
import pytest

from archive_provider.demo.fake_llm import ErrorReply, FakeLLM, Reply, ToolCall


def _client(fake: FakeLLM) -> openai.OpenAI:
    return openai.OpenAI(base_url=fake.base_url, api_key="sk-fake", max_retries=0)


def test_binds_loopback_on_a_free_port_and_stops_cleanly() -> None:
    fake = FakeLLM().start()
    port = fake.port
    assert fake.base_url == f"http://127.0.0.1:{port}/v1"
    fake.stop()
    fake.stop()  # idempotent
    with pytest.raises(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.5):
        pass


def test_models_endpoint_reports_context_length() -> None:
    with FakeLLM(model="m1", context_length=65_536) as fake:
        models = _client(fake).models.list()
        assert [m.id for m in models.data] == ["m1"]
        assert models.data[0].model_extra["context_length"] == 65_536


def test_plain_json_replies_follow_the_script_then_the_default() -> None:
    with FakeLLM(["one", Reply(content="two")], default_reply="fallback") as fake:
        client = _client(fake)
        texts = [
            client.chat.completions.create(
                model="x", messages=[{"role": "user", "content": str(i)}]
            )
            .choices[0]
            .message.content
            for i in range(3)
        ]
        assert texts == ["one", "two", "fallback"]
        assert fake.exhausted == 1 and fake.pending == 0
        assert [r["messages"][0]["content"] for r in fake.requests] == ["0", "1", "2"]


def test_tool_calls_in_plain_json() -> None:
    with FakeLLM([ToolCall("memory", {"action": "add", "content": "x"}, id="c1")]) as fake:
        choice = (
            _client(fake)
            .chat.completions.create(model="x", messages=[{"role": "user", "content": "hi"}])
            .choices[0]
        )
        assert choice.finish_reason == "tool_calls"
        (call,) = choice.message.tool_calls
        assert (call.id, call.function.name) == ("c1", "memory")
        assert json.loads(call.function.arguments) == {"action": "add", "content": "x"}


def test_streaming_text_and_tool_calls_with_final_usage() -> None:
    script = [
        "streamed hello world",
        {"content": "thinking", "tool_calls": [{"name": "t", "arguments": {"q": "a" * 50}}]},
    ]
    with FakeLLM(script) as fake:
        client = _client(fake)
        chunks = list(
            client.chat.completions.create(
                model="x",
                messages=[{"role": "user", "content": "hi"}],
                stream=True,
                stream_options={"include_usage": True},
            )
        )
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert text == "streamed hello world"
        assert chunks[-1].choices == [] and chunks[-1].usage.total_tokens > 0
        assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"

        chunks = list(
            client.chat.completions.create(
                model="x", messages=[{"role": "user", "content": "go"}], stream=True
            )
        )
        args = "".join(
            d.function.arguments or ""
            for c in chunks
            if c.choices
            for d in (c.choices[0].delta.tool_calls or [])
        )
        assert json.loads(args) == {"q": "a" * 50}
        assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"


def test_callable_script_answers_from_the_request() -> None:
    def reply(request: dict) -> str:
        return f"echo: {FakeLLM.user_texts(request)[-1]} / tools={FakeLLM.tool_names(request)}"

    tools = [{"type": "function", "function": {"name": "archive_recall", "parameters": {}}}]
    with FakeLLM(reply) as fake:
        out = _client(fake).chat.completions.create(
            model="x",
            messages=[{"role": "system", "content": "SYS"}, {"role": "user", "content": "ping"}],
            tools=tools,
        )
        assert out.choices[0].message.content == "echo: ping / tools=['archive_recall']"
        assert FakeLLM.system_prompt(fake.last_request) == "SYS"


def test_error_replies_and_unknown_paths() -> None:
    with FakeLLM([ErrorReply(503, "overloaded")]) as fake:
        with pytest.raises(openai.APIStatusError) as excinfo:
            _client(fake).chat.completions.create(
                model="x", messages=[{"role": "user", "content": "hi"}]
            )
        assert excinfo.value.status_code == 503
        with pytest.raises(urllib.error.HTTPError):
            urllib.request.urlopen(f"http://127.0.0.1:{fake.port}/props", timeout=2)
        assert [u.path for u in fake.unhandled] == ["/props"]
        assert [(r.method, r.path) for r in fake.log][-1] == ("GET", "/props")


def test_push_appends_to_a_running_script() -> None:
    with FakeLLM() as fake:
        fake.push("late reply")
        out = _client(fake).chat.completions.create(
            model="x", messages=[{"role": "user", "content": "hi"}]
        )
        assert out.choices[0].message.content == "late reply"
        assert fake.wait_for_requests(1, timeout=1)
