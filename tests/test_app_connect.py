"""`tinychat --connect URL`: the app streaming from an OpenAI-compatible server (ours, here, on
the default model and the cpu backend, with an API key), driven by Pilot."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from app_doubles import async_test, paste_text, wait_until

from chat_app.app import TinyChatApp
from chat_app.history import HistoryStore
from chat_app.remote_engine import base_url, connect, parse_metrics
from chat_app.session import ChatSettings
from gpu.config import EngineConfig
from gpu.entrypoints.openai.api_server import ServerThread, build_app
from gpu.entrypoints.openai.async_engine import build_engine_client

pytestmark = pytest.mark.slow

GREEDY = ChatSettings(temperature=0.0, repetition_penalty=1.0, max_tokens=6)
KEY = "sesame"


@pytest.fixture(scope="module")
def server(default_model_dir: Path) -> Iterator[ServerThread]:
    config = EngineConfig(max_model_len=512, max_num_seqs=4)
    # The engine in this process (no core process to start): the app only sees HTTP.
    client = build_engine_client(str(default_model_dir), "cpu", config, engine_process=False)
    client.start()
    served = ServerThread(build_app(client, api_key=KEY)).start()
    try:
        yield served
    finally:
        served.stop()
        client.shutdown()


def greedy_reply(server: ServerThread, question: str) -> str:
    body = {"messages": [{"role": "user", "content": question}], "max_tokens": 6,
            "temperature": 0}  # fmt: skip
    headers = {"Authorization": f"Bearer {KEY}"}
    r = httpx.post(server.url + "/chat/completions", json=body, headers=headers, timeout=120)
    return r.json()["choices"][0]["message"]["content"]


@async_test
async def test_the_app_streams_from_a_server_and_keeps_the_chat(server, tmp_path: Path) -> None:
    store = HistoryStore.open(tmp_path / "history.db")
    app = TinyChatApp(
        lambda: connect(server.url.removesuffix("/v1"), KEY), store, defaults=GREEDY,
        export_dir=tmp_path / "exports",
    )  # fmt: skip
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_until(pilot, lambda: app.client.ready, "the connection", timeout=60)
        assert app.client.describe() == f"SmolLM2-135M-Instruct · {server.url}"
        pane = app.chat_screen.active_pane
        await paste_text(pilot, "What is the capital of France?")
        await pilot.press("enter")
        await wait_until(pilot, lambda: not pane.replying and len(pane.session.messages) == 2,
                         "the reply", timeout=120)  # fmt: skip
        reply = pane.session.messages[-1]
        assert reply.content == greedy_reply(server, "What is the capital of France?")
        assert reply.finish_reason == "length"  # 6 tokens at most
        metrics = pane.last_metrics
        assert metrics is not None and metrics.num_generated_tokens == 6
        assert metrics.time_to_first_token is not None
        await pilot.press("ctrl+e")  # export works as on a local engine
        await wait_until(pilot, lambda: any((tmp_path / "exports").glob("*.md")), "the export")
        exported = next((tmp_path / "exports").glob("*.md")).read_text()
        assert reply.content in exported and "SmolLM2-135M-Instruct" in exported
        await pilot.press("ctrl+q")
    saved = store.load_session(pane.session.id)
    assert saved is not None and saved.messages[-1].content == reply.content
    store.close()


@async_test
async def test_escape_stops_a_remote_reply(server, tmp_path: Path) -> None:
    long = ChatSettings(temperature=0.0, repetition_penalty=1.0, max_tokens=400)
    app = TinyChatApp(lambda: connect(server.url, KEY), None, defaults=long)
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_until(pilot, lambda: app.client.ready, "the connection", timeout=60)
        pane = app.chat_screen.active_pane
        await paste_text(pilot, "Tell me a long story about a dragon.")
        await pilot.press("enter")
        await wait_until(pilot, lambda: len(pane.session.messages) == 2
                         and pane.session.messages[-1].content, "the first words", 120)  # fmt: skip
        await pilot.press("escape")
        await wait_until(pilot, lambda: not pane.replying, "the stop", timeout=30)
        assert pane.session.messages[-1].finish_reason == "abort"
        # The server dropped the request (the connection closed), not just the app.
        await wait_until(pilot, lambda: app.client.stats().num_running == 0, "the abort", 30)
        await pilot.press("ctrl+q")


def test_connecting_fails_with_the_reason() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again below: nothing listens there
    with pytest.raises(RuntimeError, match="cannot reach"):
        connect(f"http://127.0.0.1:{port}")


def test_connecting_with_a_wrong_key_or_model_fails(server) -> None:
    with pytest.raises(RuntimeError, match="401"):
        connect(server.url, "wrong")
    with pytest.raises(RuntimeError, match="does not serve 'gpt-9'"):
        connect(server.url, KEY, "gpt-9")


def test_urls_and_metrics_parsing() -> None:
    assert base_url("127.0.0.1:8000") == "http://127.0.0.1:8000/v1"
    assert base_url("http://h:1/v1/") == "http://h:1/v1"
    assert base_url("https://api.example.com/openai/v1") == "https://api.example.com/openai/v1"
    text = (
        '# HELP x\nvllm:num_requests_running{model_name="m"} 3.0\n'
        'vllm:gpu_cache_usage_perc{model_name="m"} 0.25\n'
        "tinychat:prefix_cache_hit_rate 0.5\ntinychat:prompt_tokens_total 12.0\n"
    )
    assert parse_metrics(text) == {
        "num_requests_running": 3.0,
        "gpu_cache_usage_perc": 0.25,
        "kv_cache_usage_perc": 0.25,
        "prefix_cache_hit_rate": 0.5,
        "prompt_tokens": 12.0,
    }


def strict_openai_server(seen: list[dict]) -> ServerThread:
    """A stand-in for OpenAI's own API: refuses fields it does not know (vLLM's extras) and
    streams a canned reply; no engine behind it."""
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse, StreamingResponse
    from starlette.routing import Route

    known = {"model", "messages", "stream", "stream_options", "temperature", "top_p",
             "max_tokens", "seed", "stop", "presence_penalty", "frequency_penalty"}  # fmt: skip

    async def models(request):
        return JSONResponse({"object": "list", "data": [{"id": "gpt-x", "object": "model"}]})

    async def chat(request):
        body = await request.json()
        seen.append(body)
        unknown = sorted(set(body) - known)
        if unknown:
            message = f"Unrecognized request argument supplied: {unknown[0]}"
            return JSONResponse({"error": {"message": message}}, status_code=400)

        async def events():
            for piece in ("Hello", " there", "!"):
                delta = {"choices": [{"index": 0, "delta": {"content": piece}}]}
                yield f"data: {json.dumps(delta)}\n\n"
            yield 'data: {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}\n\n'
            yield 'data: {"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 3}}\n\n'
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    app = Starlette(routes=[Route("/v1/models", models), Route("/v1/chat/completions", chat,
                                                              methods=["POST"])])  # fmt: skip
    return ServerThread(app).start()


def test_a_server_that_refuses_vllm_extras_gets_the_request_again_without_them() -> None:
    import threading

    from gpu.outputs import RequestOutput

    seen: list[dict] = []
    server = strict_openai_server(seen)
    remote = connect(server.url)
    remote.start()
    try:
        assert remote.engine.model_name == "gpt-x" and remote.engine.tokenizer is None
        for _ in range(2):
            outputs: list[RequestOutput] = []
            done = threading.Event()

            def on_output(out: RequestOutput, outputs=outputs, done=done) -> None:
                outputs.append(out)
                if out.finished:
                    done.set()

            chat = [{"role": "user", "content": "hi"}]
            remote.add_chat_request(chat, ChatSettings().sampling_params(), on_output)
            assert done.wait(30)
            assert "".join(o.outputs[0].text for o in outputs) == "Hello there!"
            final = outputs[-1]
            assert final.outputs[0].finish_reason == "stop" and final.error is None
            assert final.metrics.num_generated_tokens == 3
    finally:
        remote.shutdown()
        server.stop()
    # The app's defaults carry repetition_penalty 1.1: refused once, then never sent again.
    assert "repetition_penalty" in seen[0] and "repetition_penalty" not in seen[1]
    assert len(seen) == 3 and "repetition_penalty" not in seen[2]
    assert seen[1]["messages"] == [{"role": "user", "content": "hi"}]


def test_a_chat_that_outgrew_the_servers_context_drops_its_oldest_turns(server) -> None:
    import threading

    remote = connect(server.url, KEY)
    remote.start()
    done, outputs = threading.Event(), []

    def on_output(out) -> None:
        outputs.append(out)
        if out.finished:
            done.set()

    chat = [
        {"role": "user", "content": "word " * 600},  # alone longer than the 512-token context
        {"role": "assistant", "content": "Noted."},
        {"role": "user", "content": "What is the capital of France?"},
    ]
    try:
        remote.add_chat_request(chat, GREEDY.sampling_params(), on_output)
        assert done.wait(120)
    finally:
        remote.shutdown()
    assert outputs[-1].error is None and outputs[-1].outputs[0].finish_reason == "length"
    text = "".join(o.outputs[0].text for o in outputs)
    assert text == greedy_reply(server, "What is the capital of France?")
