"""The engine core on the GPU (skips without one): the same tokens as the in-process engine,
the kernels' build progress forwarded, and no orphan holding the GPU after a kill -9."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_engine_core_lifecycle import running

from gpu import LLM, EngineConfig, SamplingParams
from gpu.engine_core import EngineCoreClient

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[1]
PROMPT = [(7 * i) % 2000 + 1 for i in range(40)]
GREEDY = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True, seed=0)
CHAT = SamplingParams(
    temperature=0.7, top_p=0.9, repetition_penalty=1.1, max_tokens=32, ignore_eos=True, seed=1
)


@pytest.fixture(scope="module")
def model_folder(tmp_path_factory) -> Path:
    from gpu.presets import preset_config
    from weights import write_random_model

    folder = tmp_path_factory.mktemp("smollm2-random")
    return write_random_model(folder, preset_config("smollm2-135m", num_hidden_layers=4), seed=0)


def test_the_core_gives_the_in_process_tokens(model_folder: Path) -> None:
    stages: list[str] = []
    client = EngineCoreClient(
        str(model_folder),
        "cuda",
        EngineConfig(max_num_seqs=8),
        progress=lambda s, *_: stages.append(s),
    )
    client.start()
    try:
        assert client.engine.device == "cuda"
        streams = [client.submit(PROMPT, params) for params in (GREEDY, CHAT)]
        got = [[t for out in stream for t in out.outputs[0].token_ids] for stream in streams]
    finally:
        client.shutdown()
    assert client.process.returncode == 0
    assert "warming up" in stages  # the kernels' build reported through the core
    llm = LLM(str(model_folder), "cuda", max_num_seqs=8)
    want = [out.outputs[0].token_ids for out in llm.generate([PROMPT, PROMPT], [GREEDY, CHAT])]
    assert got == want


PARENT = """
import sys, threading, time
from gpu import EngineConfig, SamplingParams
from gpu.engine_core import EngineCoreClient

def start():
    c = EngineCoreClient(sys.argv[1], "cuda", EngineConfig(max_num_seqs=8))
    c.start()
    c.add_request(list(range(1, 40)), SamplingParams(max_tokens=100000, ignore_eos=True),
                  lambda out: None)
    print(c.core_pid, flush=True)

threading.Thread(target=start, daemon=True).start()
time.sleep(600)
"""


def gpu_pids() -> set[int]:
    out = subprocess.run(
        ["nvidia-smi", "--query-compute-apps=pid", "--format=csv,noheader"],
        capture_output=True,
        text=True,
    ).stdout
    return {int(line) for line in out.split() if line.strip().isdigit()}


def test_no_core_holds_the_gpu_after_a_kill_9_mid_reply(model_folder: Path) -> None:
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, str(model_folder)], stdout=subprocess.PIPE, text=True,
        cwd=ROOT,
    )  # fmt: skip
    try:
        assert parent.stdout is not None
        core = int(parent.stdout.readline())
        time.sleep(1.0)  # decoding on the GPU now
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait(10)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and (running(core) or core in gpu_pids()):
            time.sleep(0.1)
        assert not running(core), "the core outlived its parent"
        assert core not in gpu_pids(), "the core still holds the GPU"
    finally:
        parent.kill()
        parent.wait(10)
