"""On a CPU engine the app's UI thread gives the engine the cores first (a higher nice value),
while every engine it starts, the first and a restarted one, keeps the default priority."""

from __future__ import annotations

import asyncio
import os
import sys
import threading
from collections.abc import Callable
from typing import TypeVar

import pytest
from app_doubles import FakeEngine, FakeEngineThread, wait_until

from chat_app.app import TinyChatApp
from chat_app.ui_priority import UI_NICE, yield_cores_to_a_cpu_engine

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="a nice value per thread is Linux's"
)
T = TypeVar("T")


def _nice() -> int:
    return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())


def _on_a_thread(fn: Callable[[], T]) -> T:
    """Run fn on a thread of its own: a lowered priority cannot be taken back, and dies with
    the thread (the test runner's threads keep theirs)."""
    out: list[T] = []
    thread = threading.Thread(target=lambda: out.append(fn()))
    thread.start()
    thread.join()
    return out[0]


def test_only_an_engine_on_the_cpu_lowers_the_calling_thread():
    base = _nice()
    assert _on_a_thread(lambda: (yield_cores_to_a_cpu_engine("cuda"), _nice())) == (False, base)
    lowered = _on_a_thread(lambda: (yield_cores_to_a_cpu_engine("cpu"), _nice()))
    assert lowered == (True, max(base, UI_NICE))
    assert _nice() == base


class _RecordingThread(FakeEngineThread):
    started_at_nice: int | None = None

    def start(self) -> None:
        self.started_at_nice = _nice()
        super().start()


def test_the_ui_yields_and_the_engines_it_starts_do_not():
    base = _nice()
    engines: list[_RecordingThread] = []

    def factory() -> _RecordingThread:
        engines.append(_RecordingThread(FakeEngine()))
        return engines[-1]

    async def main() -> tuple[int, int]:
        app = TinyChatApp(factory, None, yield_to_cpu_engine=True)
        async with app.run_test() as pilot:
            await wait_until(pilot, lambda: app.client.ready, "the engine")
            ui_before_restart = _nice()
            app.restart_engine()  # F5, after the core crashed
            await wait_until(pilot, lambda: len(engines) == 2 and app.client.ready, "a new one")
            return ui_before_restart, _nice()

    ui = _on_a_thread(lambda: asyncio.run(main()))
    assert ui == (max(base, UI_NICE), max(base, UI_NICE))
    assert [engine.started_at_nice for engine in engines] == [base, base]
