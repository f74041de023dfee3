"""The app's work per token stays bounded when the engine outruns it (issue 23's 8-tab gap).

Counted, not timed: a receiver that falls behind the core must catch up by handing each
request one output for everything that arrived meanwhile (not one per step), and the socket's
messages must be read many at a time. The stand-in core (gpu/bench/standin_core.py) plays
the engine: a real process sending a token per request every 0.5 ms, with no model.
"""

from __future__ import annotations

import asyncio
import gc
import os
import pickle
import socket
import struct
import threading
import time
from pathlib import Path

import pytest
from app_doubles import FakeEngine, async_test, fake_app, open_tab, wait_until

from chat_app.bench_app import synthetic_model_folder
from chat_app.gc_tuning import YOUNG_THRESHOLD
from gpu.bench.standin_core import ENTRY
from gpu.engine_core import EngineCoreClient
from gpu.engine_core.client import FrameReader
from gpu.outputs import RequestOutput
from gpu.sampling_params import RequestOutputKind, SamplingParams

TOKENS = 300


@pytest.fixture(scope="module")
def synthetic_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("synthetic-core")
    return synthetic_model_folder(folder, vocab_size=256, step_s=0.0005)


def test_a_slow_consumer_gets_one_output_per_request_for_each_backlog(
    synthetic_folder: Path,
) -> None:
    """Each callback takes 50 ms (a UI thread busy with a frame), while the core makes ~100
    tokens a request: the next callback must carry all of them. One output per step would
    be 300 callbacks a request, 15 s of them."""
    outputs: dict[str, list[RequestOutput]] = {"a": [], "b": []}
    done = threading.Semaphore(0)

    def consumer(name: str):
        def on_output(output: RequestOutput) -> None:
            outputs[name].append(output)
            time.sleep(0.05)
            if output.finished:
                done.release()

        return on_output

    params = SamplingParams(max_tokens=TOKENS, ignore_eos=True, output_kind=RequestOutputKind.DELTA)
    with EngineCoreClient(str(synthetic_folder), "cpu", entry=ENTRY) as client:
        for name in outputs:
            client.add_request([1, 2, 3], params, consumer(name), request_id=name)
        for _ in outputs:
            assert done.acquire(timeout=10), "the streams did not finish in 10 s"
    for stream in outputs.values():
        ids = [t for o in stream for t in o.outputs[0].token_ids]
        assert len(ids) == TOKENS and stream[-1].finished
        assert stream[-1].outputs[0].finish_reason == "length"
        text = "".join(o.outputs[0].text for o in stream)
        assert len(text.split()) == TOKENS  # the word-per-id tokenizer: every token is text
        assert len(stream) <= 40, f"{len(stream)} outputs for {TOKENS} tokens"


def frame(payload: bytes, long_header: bool = False) -> bytes:
    if long_header:
        return struct.pack("!i", -1) + struct.pack("!Q", len(payload)) + payload
    return struct.pack("!i", len(payload)) + payload


def test_frame_reader_takes_every_whole_message_of_one_read() -> None:
    """Many messages in one read come back together; a message split across reads waits
    for its end; the 8-byte header of multiprocessing's large messages is understood."""
    ours, theirs = socket.socketpair()
    try:
        reader = FrameReader(ours.fileno())
        messages = [pickle.dumps(("step", [i], [i], [], None)) for i in range(50)]
        theirs.sendall(b"".join(frame(m) for m in messages))
        assert reader.read_frames() == messages  # one read, fifty messages

        big = pickle.dumps(list(range(5000)))
        data = frame(big, long_header=True) + frame(b"next")
        theirs.sendall(data[:7])  # not even the whole header
        writer = threading.Timer(0.05, theirs.sendall, args=(data[7:],))
        writer.start()
        assert reader.read_frames() == [big, b"next"]
        writer.join()
        theirs.close()
        with pytest.raises(EOFError):
            reader.read_frames()
    finally:
        ours.close()
        if theirs.fileno() != -1:
            theirs.close()


def test_frame_reader_reads_what_a_connection_sends() -> None:
    from multiprocessing.connection import Connection

    ours, theirs = socket.socketpair()
    sender = Connection(os.dup(theirs.fileno()))
    theirs.close()
    try:
        for n in (0, 10, 20_000):  # Connection sends a large payload's header separately
            sender.send_bytes(b"x" * n)
        reader = FrameReader(ours.fileno())
        got: list[bytes] = []
        while len(got) < 3:
            got += reader.read_frames()
        assert [len(g) for g in got] == [0, 10, 20_000]
    finally:
        sender.close()
        ours.close()


@async_test
async def test_background_tabs_streaming_do_not_refresh_the_footer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The footer (rebuilt on every bindings refresh, asking check_action for each binding)
    shows the active tab's actions: replies that start and end in other tabs leave it be."""
    from chat_app.chat_screen import ChatScreen

    refreshes: list[int] = []
    original = ChatScreen.refresh_bindings

    def counted(self: ChatScreen) -> None:
        refreshes.append(1)
        original(self)

    monkeypatch.setattr(ChatScreen, "refresh_bindings", counted)
    app, _ = fake_app(tmp_path, FakeEngine(reply_words=40))
    async with app.run_test(size=(100, 32)) as pilot:
        screen = app.chat_screen
        await wait_until(pilot, lambda: app.client.ready, "the engine")
        # Once the engine is up, start-up's heap is frozen and young collections are rarer
        # (chat_app/gc_tuning.py: full collections were the longest gaps between frames).
        assert gc.get_threshold()[0] == YOUNG_THRESHOLD and gc.get_freeze_count() > 0
        for _ in range(3):
            await open_tab(pilot)
        background, shown = screen.panes[:3], screen.panes[3]
        refreshes.clear()
        await asyncio.gather(*(pane.send(f"question {n}") for n, pane in enumerate(background)))
        await wait_until(pilot, lambda: not any(p.replying for p in background), "the replies")
        assert all(p.session.messages[-1].finish_reason == "stop" for p in background)
        assert refreshes == []  # six changes (three sends, three ends), all in hidden tabs
        await shown.send("and this one")
        await wait_until(pilot, lambda: not shown.replying, "the shown tab's reply")
        # The end's refresh may land a frame after `replying` turns False.
        await wait_until(pilot, lambda: len(refreshes) >= 2, "the shown tab's refreshes")
        await pilot.pause(0.1)
        assert len(refreshes) == 2  # its send and its end
