"""The background engine thread: streams, aborts, errors that fail one request only."""

from __future__ import annotations

import time

import numpy as np
import pytest
from engine_helpers import EOS_ID, ScriptedExecutor, random_prompts, scripted_engine, tiny_engine

from gpu import LLM, SamplingParams
from gpu.engine_thread import EngineThread


@pytest.fixture
def thread_of():
    started = []

    def make(engine):
        t = EngineThread(engine)
        t.start()
        started.append(t)
        return t

    yield make
    for t in started:
        t.shutdown()


def test_streams_deliver_the_same_text_as_a_static_batch(thread_of):
    prompts = random_prompts(4, seed=21)
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    expected = LLM(engine=tiny_engine()).generate(prompts, params)
    et = thread_of(tiny_engine())
    streams = [et.submit(p, params) for p in prompts]
    for stream, exp in zip(streams, expected, strict=True):
        outs = list(stream)
        ids = [t for o in outs for t in o.outputs[0].token_ids]
        assert ids == exp.outputs[0].token_ids
        assert "".join(o.outputs[0].text for o in outs) == exp.outputs[0].text
        assert outs[-1].finished and outs[-1].outputs[0].finish_reason == "length"


def test_abort_from_another_thread_ends_the_stream(thread_of):
    def script(seed, step):
        time.sleep(0.002)
        return 65

    et = thread_of(scripted_engine(script))
    stream = et.submit([1, 2], SamplingParams(temperature=1, seed=1, max_tokens=None))
    first = next(iter(stream))
    assert first.outputs[0].text
    et.abort(stream.request_id)
    outs = list(stream)
    assert outs[-1].finished and outs[-1].outputs[0].finish_reason == "abort"
    deadline = time.monotonic() + 2
    while et.stats().kv_blocks_used and time.monotonic() < deadline:
        time.sleep(0.01)
    assert et.stats().kv_blocks_used == 0


def test_a_failing_step_fails_its_requests_and_the_thread_goes_on(thread_of):
    class Flaky(ScriptedExecutor):
        fail_next = True

        def execute(self, batch, md):
            if self.fail_next:
                self.fail_next = False
                raise RuntimeError("kernel exploded")
            return super().execute(batch, md)

    engine = scripted_engine(executor=Flaky(lambda seed, step: 66 if step < 3 else EOS_ID))
    et = thread_of(engine)
    first = et.submit([1], SamplingParams(temperature=1, seed=1))
    outs = list(first)
    assert outs[-1].outputs[0].finish_reason == "error"
    assert "kernel exploded" in outs[-1].error
    second = et.submit([1], SamplingParams(temperature=1, seed=2))
    assert second.text() == "BBB"
    assert et.is_alive


def test_prompt_too_long_raises_in_the_callers_thread(thread_of):
    et = thread_of(tiny_engine(max_model_len=32))
    with pytest.raises(ValueError, match="context is 32 tokens"):
        et.submit(list(range(40)), SamplingParams())


def test_a_consumer_that_does_not_read_never_blocks_the_engine(thread_of):
    et = thread_of(scripted_engine(lambda seed, step: 67 if step < 50 else EOS_ID))
    unread = et.submit([1], SamplingParams(temperature=1, seed=3, max_tokens=None))
    fast = et.submit([1], SamplingParams(temperature=1, seed=4, max_tokens=None))
    assert fast.text() == "C" * 50  # finished while nobody read the other request
    assert unread.text() == "C" * 50  # and nothing of the unread one was lost


def test_stats_report_the_engine(thread_of):
    et = thread_of(tiny_engine())
    stream = et.submit([1, 2, 3], SamplingParams(temperature=0, max_tokens=5, ignore_eos=True))
    stream.text()
    stats = et.stats()
    assert stats.kv_blocks_total == 256 and stats.num_running == 0
    assert np.isfinite(stats.tokens_per_s)


def test_shutdown_aborts_running_requests():
    et = EngineThread(scripted_engine(lambda seed, step: (time.sleep(0.002), 65)[1]))
    et.start()
    stream = et.submit([1], SamplingParams(temperature=1, seed=1, max_tokens=None))
    next(iter(stream))
    et.shutdown()
    assert list(stream)[-1].outputs[0].finish_reason == "abort"
    assert not et.is_alive
    with pytest.raises(RuntimeError, match="shut down"):
        et.submit([1], SamplingParams())


def test_the_switch_interval_is_shortened_while_engines_run_and_then_given_back(monkeypatch):
    """The GIL switch interval is process state: two engine threads shorten it while either
    runs, and the last to stop gives back the value it found."""
    import sys

    monkeypatch.setattr("gpu.engine_thread.SWITCH_INTERVAL_MS", 2.0)
    before = sys.getswitchinterval()
    sys.setswitchinterval(0.004)
    try:
        first = EngineThread(scripted_engine(lambda seed, step: 65))
        second = EngineThread(scripted_engine(lambda seed, step: 65))
        first.start()
        assert sys.getswitchinterval() == pytest.approx(0.002)
        second.start()
        first.shutdown()
        assert not first.is_alive and sys.getswitchinterval() == pytest.approx(0.002)
        second.shutdown()
        assert not second.is_alive and sys.getswitchinterval() == pytest.approx(0.004)
    finally:
        sys.setswitchinterval(before)
