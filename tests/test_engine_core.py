"""The engine core in its own process, through EngineCoreClient, on the real default model (cpu).

One core serves the tests of this module (a build costs seconds); each test leaves it idle.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from gpu import SamplingParams
from gpu.engine_core import EngineCoreClient
from gpu.outputs import RequestOutput

pytestmark = pytest.mark.slow

GREEDY = SamplingParams(temperature=0.0, max_tokens=24)
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def client(default_model_dir: Path):
    stages: list[str] = []
    with EngineCoreClient(
        str(default_model_dir), "cpu", progress=lambda stage, *_: stages.append(stage)
    ) as client:
        assert "loading weights" in stages  # the build's progress crossed the boundary
        yield client
    assert client.process.returncode == 0  # SHUTDOWN: a clean exit, not a kill


def question_ids(client: EngineCoreClient) -> list[int]:
    tok = client.engine.tokenizer
    return list(tok.apply_chat_template(QUESTION, add_generation_prompt=True, tokenize=True))


def collect(client: EngineCoreClient, prompt, params: SamplingParams) -> list[RequestOutput]:
    return list(client.submit(prompt, params))


def test_streams_deltas_and_describes_the_engine(client: EngineCoreClient) -> None:
    assert client.engine.model_name == "SmolLM2-135M-Instruct"
    assert client.engine.device == "cpu" and client.engine.kv_capacity_tokens > 0
    outs = collect(client, question_ids(client), GREEDY)
    assert len(outs) > 2 and [o.finished for o in outs] == [False] * (len(outs) - 1) + [True]
    assert "".join(o.outputs[0].text for o in outs) == "The capital of France is Paris."
    last = outs[-1]
    assert last.outputs[0].finish_reason == "stop" and last.error is None
    assert last.outputs[0].token_ids[-1] == 2  # EOS: in the ids, never in the text
    m = last.metrics
    assert m is not None and m.num_generated_tokens == sum(
        len(o.outputs[0].token_ids) for o in outs
    )
    assert m.first_token_time is not None and m.time_to_first_token > 0
    # The core sends a stats snapshot when it goes idle; it may arrive after the last output.
    deadline = time.monotonic() + 10
    while client.stats().num_running and time.monotonic() < deadline:
        time.sleep(0.01)
    stats = client.stats()
    assert stats.kv_blocks_total > 0 and stats.prefix_cache_queries > 0
    assert stats.num_running == 0  # the snapshot sent when the core went idle


def test_stop_strings_are_cut_in_the_client(client: EngineCoreClient) -> None:
    params = SamplingParams(temperature=0.0, max_tokens=24, stop=["Paris"])
    outs = collect(client, question_ids(client), params)
    assert "".join(o.outputs[0].text for o in outs) == "The capital of France is "
    assert outs[-1].outputs[0].finish_reason == "stop"
    assert outs[-1].outputs[0].stop_reason == "Paris"
    # The core was told to drop the request: nothing of it is left running.
    assert collect(client, question_ids(client), GREEDY)[-1].outputs[0].finish_reason == "stop"


def test_abort_ends_the_request_and_the_core_goes_on(client: EngineCoreClient) -> None:
    long = SamplingParams(temperature=0.0, max_tokens=400, ignore_eos=True)
    outs: list[RequestOutput] = []
    done = threading.Event()
    first = threading.Event()

    def on_output(out: RequestOutput) -> None:
        outs.append(out)
        first.set()
        if out.finished:
            done.set()

    request_id = client.add_request(question_ids(client), long, on_output)
    assert first.wait(60)
    client.abort(request_id)
    assert done.wait(30)
    assert outs[-1].outputs[0].finish_reason == "abort"
    assert sum(len(o.outputs[0].token_ids) for o in outs) < 400
    assert client.submit(question_ids(client), GREEDY).text() == "The capital of France is Paris."


def test_a_failing_request_leaves_its_neighbours_alone(client: EngineCoreClient) -> None:
    neighbour = client.submit(question_ids(client), GREEDY)
    bad = client.submit([1, 2, 10**7], GREEDY)  # an id outside the vocabulary: the core refuses
    failed = list(bad)
    assert len(failed) == 1 and failed[0].finished
    assert failed[0].outputs[0].finish_reason == "error"
    assert "token ids must be in" in (failed[0].error or "")
    assert neighbour.text() == "The capital of France is Paris."


def test_a_prompt_longer_than_the_context_is_refused_at_once(client: EngineCoreClient) -> None:
    with pytest.raises(ValueError, match="context"):
        client.add_request([1] * client.engine.max_model_len, GREEDY, lambda out: None)
    with pytest.raises(ValueError, match="empty"):
        client.add_request([], GREEDY, lambda out: None)
