"""`tinychat serve` on the default model (cpu backend), through the official `openai` client:
the same greedy text as `tinychat generate`, usage, every error's status and shape, the API
key, /metrics, and a client that leaves mid-stream aborting its request."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from chat_app.cli import main as tinychat_main
from gpu.config import EngineConfig
from gpu.entrypoints.openai.api_server import ServerThread, build_app
from gpu.entrypoints.openai.async_engine import build_engine_client
from gpu.entrypoints.openai.serving import sse, sse_template

pytestmark = pytest.mark.slow

QUESTION = "Tell me a story about a dragon."
MAX_TOKENS = 8
CONTEXT = 256


class Served:
    def __init__(self, client, server: ServerThread, keyed: ServerThread) -> None:
        self.engine_client = client
        self.url = server.url
        self.keyed_url = keyed.url
        self.model = client.engine.model_name
        self.openai = openai.OpenAI(base_url=server.url, api_key="none", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def served(default_model_dir: Path) -> Iterator[Served]:
    """One engine, two servers on it: open, and with --api-key secret."""
    config = EngineConfig(max_model_len=CONTEXT, max_num_seqs=4)
    client = build_engine_client(str(default_model_dir), "cpu", config)
    client.start()
    server = ServerThread(build_app(client)).start()
    keyed = ServerThread(build_app(client, api_key="secret")).start()
    try:
        yield Served(client, server, keyed)
    finally:
        server.stop()
        keyed.stop()
        client.shutdown()


@pytest.fixture(scope="module")
def generated(default_model_dir: Path, tinychat_test_home: Path) -> dict:
    """`tinychat generate --json`: greedy, the reference for the server's text."""
    import contextlib
    import io

    out = io.StringIO()
    argv = ["generate", QUESTION, "--model", str(default_model_dir), "--device", "cpu",
            "--max-tokens", str(MAX_TOKENS), "--max-model-len", str(CONTEXT), "--json",
            "--no-engine-process"]  # fmt: skip
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        assert tinychat_main(argv) == 0
    return json.loads(out.getvalue())


def chat(served: Served, **kwargs):
    return served.openai.chat.completions.create(
        model=served.model,
        messages=[{"role": "user", "content": QUESTION}],
        max_tokens=MAX_TOKENS,
        temperature=0,
        **kwargs,
    )


def test_chat_equals_tinychat_generate_whole_and_streamed(served: Served, generated: dict):
    reply = chat(served)
    assert reply.choices[0].message.content == generated["text"]
    assert reply.choices[0].message.role == "assistant"
    assert reply.choices[0].finish_reason == "length"  # 8 tokens: cut short
    assert reply.usage.prompt_tokens == len(generated["prompt_ids"])
    assert reply.usage.completion_tokens == len(generated["output_ids"]) == MAX_TOKENS
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + MAX_TOKENS
    assert reply.model == served.model and reply.object == "chat.completion"

    chunks = list(chat(served, stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == generated["text"]
    finals = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finals[-1] == "length" and set(finals[:-1]) == {None}
    usage = chunks[-1].usage  # the last chunk: no choices, the usage
    assert chunks[-1].choices == [] and all(c.usage is None for c in chunks[:-1])
    assert (usage.prompt_tokens, usage.completion_tokens) == (reply.usage.prompt_tokens, 8)


def test_completions_take_token_ids_and_text(served: Served, generated: dict):
    ids = generated["prompt_ids"]
    whole = served.openai.completions.create(
        model=served.model, prompt=ids, max_tokens=MAX_TOKENS, temperature=0
    )
    assert whole.choices[0].text == generated["text"]
    assert whole.usage.prompt_tokens == len(ids)
    assert whole.usage.completion_tokens == MAX_TOKENS
    stream = served.openai.completions.create(
        model=served.model, prompt="The capital of France is", max_tokens=3, temperature=0,
        stream=True, stream_options={"include_usage": True},
    )  # fmt: skip
    chunks = list(stream)
    assert chunks[-1].usage.completion_tokens == 3
    assert chunks[-2].choices[0].finish_reason == "length"
    assert "".join(c.choices[0].text for c in chunks if c.choices).strip()


def test_a_stop_string_ends_the_reply_without_it(served: Served, generated: dict):
    word = generated["text"].split()[2]  # the third word of the greedy reply
    reply = chat(served, stop=[word])
    assert reply.choices[0].finish_reason == "stop"
    assert word not in reply.choices[0].message.content
    assert generated["text"].startswith(reply.choices[0].message.content)


def error_of(call) -> tuple[int, dict]:
    with pytest.raises(openai.APIStatusError) as info:
        call()
    body = info.value.body
    return info.value.status_code, body if "message" in body else body["error"]


def bad_chat(served: Served, **body):
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, **body}
    return lambda: served.openai.chat.completions.create(**body)


@pytest.mark.parametrize(
    "body, param, words",
    [
        ({"model": "x", "n": 2}, "n", "n other than 1"),
        ({"model": "x", "logprobs": True}, "logprobs", "logprobs"),
        ({"model": "x", "tools": [{"type": "function", "function": {"name": "f"}}]}, "tools",
         "Tool calling"),
        ({"model": "x", "messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA=="}}]}]},
         "messages.0.content", "Images"),
        ({"model": "x", "max_tokens": "many"}, "max_tokens", "valid integer"),
        ({"model": "x", "temperature": -1}, None, "temperature must be non-negative"),
    ],
)  # fmt: skip
def test_what_is_not_served_is_400_in_openai_shape(served: Served, body, param, words):
    body["model"] = served.model
    status, error = error_of(bad_chat(served, **body))
    assert status == 400
    assert error["type"] == "invalid_request_error" and error["param"] == param
    assert words in error["message"]


def test_an_unknown_model_is_404(served: Served):
    status, error = error_of(bad_chat(served, model="gpt-9"))
    assert status == 404 and error["code"] == "model_not_found"
    assert "gpt-9" in error["message"] and served.model in error["message"]


def test_a_prompt_longer_than_the_context_is_400_with_the_lengths(served: Served):
    long = " ".join(["word"] * (CONTEXT + 20))
    status, error = error_of(bad_chat(served, model=served.model, messages=[
        {"role": "user", "content": long}]))  # fmt: skip
    assert status == 400 and error["code"] == "context_length_exceeded"
    assert f"maximum context length is {CONTEXT} tokens" in error["message"]
    assert "prompt is " in error["message"]


def test_max_tokens_beyond_the_context_is_cut_to_what_it_leaves(served: Served):
    prompt = [1000 + i for i in range(CONTEXT - 3)]  # room for 3 tokens
    reply = served.openai.completions.create(
        model=served.model, prompt=prompt, max_tokens=100, temperature=0,
        extra_body={"ignore_eos": True},
    )  # fmt: skip
    assert reply.choices[0].finish_reason == "length"
    assert reply.usage.completion_tokens == 3


def test_bad_json_and_unknown_routes(served: Served):
    r = httpx.post(served.url + "/chat/completions", content=b"{not json", timeout=30)
    assert r.status_code == 400 and "not valid JSON" in r.json()["error"]["message"]
    r = httpx.post(served.url + "/completions", json=[1, 2], timeout=30)
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    r = httpx.get(served.url + "/nothing-here", timeout=30)
    assert r.status_code == 404 and "error" in r.json()
    r = httpx.get(served.url + "/chat/completions", timeout=30)
    assert r.status_code == 405 and "error" in r.json()


def test_models_and_health(served: Served):
    models = served.openai.models.list().data
    assert [m.id for m in models] == [served.model]
    assert models[0].model_extra["max_model_len"] == CONTEXT
    assert httpx.get(served.url.removesuffix("/v1") + "/health", timeout=30).status_code == 200


def test_the_api_key_is_required_when_set(served: Served):
    for key in ("wrong", None):
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        r = httpx.get(served.keyed_url + "/models", headers=headers, timeout=30)
        assert r.status_code == 401
        assert r.json()["error"]["code"] == "invalid_api_key"
    keyed = openai.OpenAI(base_url=served.keyed_url, api_key="secret", max_retries=0)
    assert [m.id for m in keyed.models.list().data] == [served.model]
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=served.keyed_url, api_key="nope", max_retries=0).models.list()
    health = httpx.get(served.keyed_url.removesuffix("/v1") + "/health", timeout=30)
    assert health.status_code == 200  # /health and /metrics stay open


def wait_for(condition, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def test_a_client_that_leaves_mid_stream_aborts_its_request(served: Served):
    before = aborted(served)
    body = {
        "model": served.model,
        "messages": [{"role": "user", "content": "Tell me a long story."}],
        "max_tokens": CONTEXT - 64,
        "ignore_eos": True,
        "temperature": 0,
        "stream": True,
    }
    with httpx.stream("POST", served.url + "/chat/completions", json=body, timeout=60) as r:
        lines = r.iter_lines()
        while '"content":"' not in next(lines) or not served.engine_client.stats().num_running:
            pass  # until a token has streamed and the engine holds the request
    # The connection is closed here: the engine drops the request long before its 192 tokens.
    wait_for(lambda: served.engine_client.stats().num_running == 0, "the abort", timeout=10)
    wait_for(lambda: aborted(served) == before + 1, "the abort's count", timeout=5)


def test_a_client_that_leaves_before_a_whole_reply_aborts_it(served: Served):
    body = {
        "model": served.model,
        "prompt": "Once upon a time",
        "max_tokens": CONTEXT - 64,
        "ignore_eos": True,
        "temperature": 0,
    }
    before = aborted(served)
    with pytest.raises(httpx.ReadTimeout):  # gives up long before 192 tokens on the cpu
        httpx.post(served.url + "/completions", json=body, timeout=httpx.Timeout(30, read=1.5))
    wait_for(lambda: served.engine_client.stats().num_running == 0, "the abort", timeout=10)
    wait_for(lambda: aborted(served) == before + 1, "the abort's count", timeout=5)


def aborted(served: Served) -> float:
    """Requests that ended as "abort" (the client left), from /metrics."""
    samples = metrics(served)["tinychat:request_success"].samples
    return sum(s.value for s in samples if s.labels.get("finished_reason") == "abort")


def metrics(served: Served) -> dict:
    text = httpx.get(served.url.removesuffix("/v1") + "/metrics", timeout=30).text
    return {f.name: f for f in text_string_to_metric_families(text)}


def test_metrics_parse_and_count(served: Served):
    chat(served)
    families = metrics(served)
    for name in ("num_requests_running", "num_requests_waiting", "kv_cache_usage_perc",
                 "prefix_cache_hit_rate", "prompt_tokens", "generation_tokens",
                 "time_to_first_token_seconds", "inter_token_latency_seconds"):  # fmt: skip
        assert f"tinychat:{name}" in families, name

    def value(family: str, sample: str) -> float:
        return next(s.value for s in families[family].samples if s.name == sample)

    assert value("tinychat:generation_tokens", "tinychat:generation_tokens_total") >= MAX_TOKENS
    assert value("tinychat:prompt_tokens", "tinychat:prompt_tokens_total") > 0
    ttft = "tinychat:time_to_first_token_seconds"
    assert value(ttft, ttft + "_count") >= 1
    itl = "tinychat:inter_token_latency_seconds"
    assert value(itl, itl + "_count") >= 1
    assert 0 <= value("tinychat:kv_cache_usage_perc", "tinychat:kv_cache_usage_perc") <= 1


def test_serve_without_the_server_packages_says_what_to_install():
    import subprocess
    import sys

    code = (
        "import sys; sys.modules['starlette'] = None\n"
        "from chat_app.cli import main; sys.exit(main(['serve']))"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 1
    assert r.stderr.strip() == (
        "tinychat: error: tinychat serve needs the server's packages (starlette is missing): "
        "pip install 'tinychat[serve]'"
    )


def test_a_port_in_use_fails_before_the_model_loads(monkeypatch, capsys):
    import socket

    import gpu.entrypoints.openai.async_engine as async_engine

    def no_load(*args, **kwargs):
        raise AssertionError("the model was loaded before the port was checked")

    monkeypatch.setattr(async_engine, "build_engine_client", no_load)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        assert tinychat_main(["serve", "--device", "cpu", "--port", str(port)]) == 1
    assert capsys.readouterr().err.strip() == (
        f"tinychat: error: cannot listen on 127.0.0.1:{port}: Address already in use "
        "(another server there? choose a port with --port)"
    )


def test_ctrl_c_twice_stops_the_server_without_a_traceback(default_model_dir: Path):
    """The first Ctrl+C starts the graceful stop; a second one, impatient, ends it at once:
    uvicorn then skips the app's shutdown, whose cancelled task it logged as a traceback."""
    import signal
    import socket
    import subprocess
    import sys

    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    argv = ["serve", "--model", str(default_model_dir), "--device", "cpu", "--port", str(port),
            "--max-model-len", str(CONTEXT)]  # fmt: skip
    code = f"import sys; from chat_app.cli import main; sys.exit(main({argv!r}))"
    server = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        wait_for(lambda: _healthy(port), "the server to answer /health", timeout=120)
        server.send_signal(signal.SIGINT)
        time.sleep(0.05)
        server.send_signal(signal.SIGINT)
        out, err = server.communicate(timeout=60)
    finally:
        server.kill()
    assert "Traceback" not in err, err
    assert err.strip().endswith("tinychat: interrupted"), err
    assert server.returncode != 0


def _healthy(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def test_return_token_ids_streams_ids_that_decode_to_the_text(served: Served, generated: dict):
    """vLLM's `return_token_ids`: the prompt's ids in the first chunk, each chunk's new ids in
    its choice; whole replies carry them all. The ids are the reply's, and decode to its text."""
    extra = {"extra_body": {"return_token_ids": True}}
    tokenizer = served.engine_client.engine.tokenizer
    stream = list(chat(served, stream=True, **extra))
    first = stream[0].model_extra
    assert first["prompt_token_ids"] == generated["prompt_ids"]
    assert all("prompt_token_ids" not in c.model_extra for c in stream[1:])
    ids = [t for c in stream for t in c.choices[0].model_extra["token_ids"]]
    text = "".join(c.choices[0].delta.content or "" for c in stream)
    assert ids == generated["output_ids"] and text == generated["text"]
    assert tokenizer.decode(ids) == text
    whole = chat(served, **extra)
    assert whole.choices[0].model_extra["token_ids"] == generated["output_ids"]
    assert whole.model_extra["prompt_token_ids"] == generated["prompt_ids"]

    prompt = generated["prompt_ids"]
    chunks = list(served.openai.completions.create(
        model=served.model, prompt=prompt, max_tokens=MAX_TOKENS, temperature=0, stream=True,
        **extra))  # fmt: skip
    assert chunks[0].choices[0].model_extra["prompt_token_ids"] == prompt
    ids = [t for c in chunks for t in c.choices[0].model_extra["token_ids"]]
    assert ids == generated["output_ids"]
    assert "".join(c.choices[0].text for c in chunks) == generated["text"]
    plain = list(served.openai.completions.create(
        model=served.model, prompt=prompt, max_tokens=2, temperature=0, stream=True))  # fmt: skip
    assert all("token_ids" not in c.choices[0].model_extra for c in plain)


@pytest.mark.parametrize("text", ["a", "", ' "quoted" \\ back\nslash\t', "\x00\x1f é 漢 🚀"])
def test_a_templated_event_is_the_bytes_of_the_whole_object(text: str):
    """The hot path serializes only the text (and ids) into a prefix and suffix made once:
    byte for byte what serializing the whole chunk gives, and it parses to the same object."""
    head = {"id": "cmpl-1", "object": "text_completion", "created": 1, "model": "m", "usage": None}
    choice = {"index": 0, "text": "", "logprobs": None, "finish_reason": None, "token_ids": []}
    template = sse_template(
        {**head, "choices": [dict(choice)]}, ("choices", 0, "text"), ("choices", 0, "token_ids")
    )
    whole = {**head, "choices": [{**choice, "text": text, "token_ids": [3, 1, 4]}]}
    event = template(text, [3, 1, 4])
    assert event == sse(whole)
    assert event.startswith(b"data: ") and event.endswith(b"\n\n")
    assert json.loads(event[6:]) == whole
    only_text = sse_template({**head, "choices": [dict(choice)]}, ("choices", 0, "text"))
    assert json.loads(only_text(text)[6:])["choices"][0]["text"] == text


def test_the_loop_metrics_render_as_prometheus_client_s_own():
    """The lock-free counter and histogram the event loop feeds give the same Prometheus text
    as prometheus_client's Counter and Histogram fed the same observations."""
    from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

    from gpu.entrypoints.openai.metrics import LoopCounter, LoopHistogram

    buckets, label = (0.001, 0.01, 0.1, 1.0), {"model_name": "m"}
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    histogram, counter = (
        LoopHistogram("x_seconds", "d", label, buckets),
        LoopCounter("n", "d", label),
    )
    ours.register(histogram)
    ours.register(counter)
    reference = Histogram("x_seconds", "d", ["model_name"], buckets=buckets, registry=theirs)
    reference_counter = Counter("n", "d", ["model_name"], registry=theirs)
    for value, count in ((0.0005, 1), (0.001, 2), (0.05, 3), (7.0, 1)):
        histogram.observe(value, count)
        counter.inc(count)
        for _ in range(count):
            reference.labels(model_name="m").observe(value)
        reference_counter.labels(model_name="m").inc(count)
    lines = lambda r: sorted(  # noqa: E731
        line for line in generate_latest(r).decode().splitlines() if "_created" not in line
    )
    assert lines(ours) == lines(theirs)


def test_bench_serve_against_a_running_server(served: Served, tmp_path, capsys):
    """`tinychat bench serve --url`: streaming clients against any OpenAI-compatible server,
    a row per sampling setting (greedy and the app's defaults), every token delivered."""
    from chat_app.cli import main as tinychat_main

    out = tmp_path / "url.json"
    argv = ["bench", "serve", "--url", served.url, "--clients", "2", "--new-tokens", "3",
            "--prompt-len", "4", "--json", str(out)]  # fmt: skip
    assert tinychat_main(argv) == 0
    results = json.loads(out.read_text())
    assert list(results["settings"]) == ["greedy", "chat"]
    for setting in results["settings"].values():
        http = setting["http"]
        assert http["errors"] == 0 and http["output_tokens"] == http["expected_tokens"] == 6
    assert "chat: temperature 0.7, top-p 0.9, repetition penalty 1.1" in capsys.readouterr().out
