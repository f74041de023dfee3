"""The hand-off from the engine thread to the UI, and the fake engine the app tests run on."""

from __future__ import annotations

import threading

import pytest
from app_doubles import FakeEngine, FakeEngineThread

from chat_app.bridge import CPU_ENGINE_FPS, DEFAULT_FPS, OutputBridge, OutputsReady
from gpu.outputs import CompletionOutput, RequestOutput
from gpu.sampling_params import SamplingParams


class Recorder:
    """Stands in for the App: records what is posted to it (from any thread)."""

    def __init__(self) -> None:
        self.posted: list[object] = []
        self.lock = threading.Lock()

    def post_message(self, message: object) -> bool:
        with self.lock:
            self.posted.append(message)
        return True


def _out(request_id: str, text: str, finished: bool = False, reason: str | None = None):
    ids = [1] if text else []
    return RequestOutput(request_id, None, [], [CompletionOutput(0, text, ids, reason)], finished)


def test_one_wakeup_until_drained_and_deltas_merged_per_request() -> None:
    target = Recorder()
    bridge = OutputBridge(target)  # type: ignore[arg-type]
    for piece in ["Hel", "lo", " there"]:
        bridge.on_output(_out("a", piece))
    bridge.on_output(_out("b", "Hi"))
    bridge.on_output(_out("b", "!", finished=True, reason="stop"))
    assert len(target.posted) == 1 and isinstance(target.posted[0], OutputsReady)

    updates = {u.request_id: u for u in bridge.drain()}
    assert (updates["a"].text, updates["a"].num_tokens, updates["a"].finished) == (
        "Hello there",
        3,
        False,
    )
    assert (updates["b"].text, updates["b"].finished, updates["b"].finish_reason) == (
        "Hi!",
        True,
        "stop",
    )
    assert bridge.drain() == []
    bridge.on_output(_out("a", "."))
    assert len(target.posted) == 2  # a new output after a drain wakes the UI again


def test_outputs_from_many_threads_are_all_delivered_in_order_per_request() -> None:
    target = Recorder()
    bridge = OutputBridge(target)  # type: ignore[arg-type]
    n = 2000

    def produce(request_id: str) -> None:
        for i in range(n):
            bridge.on_output(_out(request_id, f"{i},"))

    threads = [threading.Thread(target=produce, args=(f"r{k}",)) for k in range(4)]
    for t in threads:
        t.start()
    texts: dict[str, str] = {}
    while any(t.is_alive() for t in threads) or bridge._queue:
        for update in bridge.drain():
            texts[update.request_id] = texts.get(update.request_id, "") + update.text
    for t in threads:
        t.join()
    for update in bridge.drain():
        texts[update.request_id] = texts.get(update.request_id, "") + update.text
    expected = "".join(f"{i}," for i in range(n))
    assert texts == {f"r{k}": expected for k in range(4)}
    assert len(target.posted) < 4 * n  # coalesced: far fewer wake-ups than outputs


def test_drains_are_paced_to_the_frame_rate() -> None:
    now = [10.0]
    bridge = OutputBridge(Recorder(), fps=20, clock=lambda: now[0])  # type: ignore[arg-type]
    assert bridge.delay_until_next_frame() == 0.0
    bridge.drain()
    assert bridge.delay_until_next_frame() == pytest.approx(0.05)
    now[0] += 0.03
    assert bridge.delay_until_next_frame() == pytest.approx(0.02)
    now[0] += 0.05
    assert bridge.delay_until_next_frame() == 0.0


def test_drains_are_paced_slower_when_the_engine_computes_on_the_cpu() -> None:
    """A CPU engine shares its cores with the UI: at most CPU_ENGINE_FPS frames a second."""
    for device, fps in (("cuda", DEFAULT_FPS), ("cpu", CPU_ENGINE_FPS)):
        now = [10.0]
        bridge = OutputBridge(Recorder(), clock=lambda now=now: now[0])  # type: ignore[arg-type]
        bridge.pace_for(device)
        bridge.drain()
        assert bridge.delay_until_next_frame() == pytest.approx(1 / fps)
    slow = OutputBridge(Recorder(), fps=5)  # type: ignore[arg-type]
    slow.pace_for("cpu")  # a slower pace that was asked for stays
    assert slow.frame_interval == pytest.approx(0.2)


# -- the fake engine honours the engine thread's contract ----------------------------------


def _collect(thread: FakeEngineThread, prompt, params, request_id=None):
    outputs: list[RequestOutput] = []
    done = threading.Event()

    def on_output(output: RequestOutput) -> None:
        assert threading.current_thread() is not threading.main_thread()
        outputs.append(output)
        if output.finished:
            done.set()

    rid = thread.add_request(prompt, params, on_output, request_id=request_id)
    return rid, outputs, done


def test_fake_engine_streams_deltas_that_add_up_to_the_reply() -> None:
    thread = FakeEngineThread(FakeEngine(reply_words=5))
    thread.start()
    try:
        ids = thread.engine.tokenizer.apply_chat_template([{"role": "user", "content": "ping"}])
        rid, outputs, done = _collect(thread, ids, SamplingParams(max_tokens=100), "x-1")
        assert rid == "x-1"
        assert done.wait(5)
        text = "".join(o.outputs[0].text for o in outputs)
        assert text == "You said: **ping**. Every word of this reply"
        assert outputs[-1].outputs[0].finish_reason == "stop"
        assert all(not o.finished for o in outputs[:-1])
        assert outputs[-1].metrics.time_to_first_token is not None
    finally:
        thread.shutdown()


def test_fake_engine_refuses_a_prompt_longer_than_the_context_at_once() -> None:
    thread = FakeEngineThread(FakeEngine(max_model_len=32))
    with pytest.raises(ValueError, match="longer than the model's context of 32 tokens"):
        thread.add_request(list(range(40)), SamplingParams(), lambda o: None)


def test_fake_engine_abort_frees_blocks_and_ends_with_abort() -> None:
    thread = FakeEngineThread(FakeEngine(reply_words=20), manual=True)
    thread.start()
    try:
        _, outputs, done = _collect(thread, list(range(100)), SamplingParams(max_tokens=50))
        thread.allow_steps(3)
        assert thread.wait_idle(0.5) is False  # still running: only 3 steps allowed
        assert thread.stats().num_running == 1
        assert thread.stats().kv_blocks_used > 0
        thread.abort(outputs[0].request_id)
        thread.allow_steps(1)
        assert done.wait(5)
        assert outputs[-1].outputs[0].finish_reason == "abort"
        assert thread.stats().kv_blocks_used == 0
    finally:
        thread.shutdown()


def test_fake_engine_max_tokens_and_prefix_cache_hits() -> None:
    thread = FakeEngineThread(FakeEngine(reply_words=20))
    thread.start()
    try:
        prompt = list(range(64))
        _, outputs, done = _collect(thread, prompt, SamplingParams(max_tokens=3))
        assert done.wait(5)
        assert len(outputs) == 3 and outputs[-1].outputs[0].finish_reason == "length"
        _, outputs, done = _collect(thread, prompt + [7] * 10, SamplingParams(max_tokens=1))
        assert done.wait(5)
        assert outputs[-1].metrics.num_cached_tokens == 64
        assert thread.stats().prefix_cache_hit_rate > 0
    finally:
        thread.shutdown()


def test_fake_engine_shutdown_aborts_everything() -> None:
    thread = FakeEngineThread(FakeEngine(reply_words=20), manual=True)
    thread.start()
    _, outputs, done = _collect(thread, [1, 2, 3], SamplingParams(max_tokens=50))
    thread.shutdown()
    assert done.is_set()
    assert outputs[-1].outputs[0].finish_reason == "abort"
