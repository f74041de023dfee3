"""The engine as the app sees it: the few attributes and calls the UI may use, and no more.

These protocols are the whole contract between `chat_app` and `gpu`. The real
`gpu.engine_thread.EngineThread` and the test double in `tests/app_doubles.py` both satisfy them;
nothing in the app reaches past them (no kernels, no KV layout, no scheduler).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

from gpu.outputs import EngineStats, RequestOutput
from gpu.sampling_params import SamplingParams

OutputCallback = Callable[[RequestOutput], None]


class Tokenizer(Protocol):
    """What the app needs from the model's tokenizer: the chat template and decoding."""

    def apply_chat_template(
        self, messages: list[dict[str, str]], add_generation_prompt: bool = ..., **kwargs: Any
    ) -> Any: ...

    def decode(self, ids: list[int]) -> str: ...


class Engine(Protocol):
    """`LLMEngine`: the model's description (for the status bar) and its tokenizer."""

    tokenizer: Tokenizer
    model_name: str
    device: str
    max_model_len: int
    kv_capacity_tokens: int

    def stats(self) -> EngineStats: ...


class EngineThread(Protocol):
    """The engine's step loop in a background thread; every call here is thread-safe.

    `on_output` runs on the engine thread with delta outputs and must never block.
    """

    engine: Engine

    def start(self) -> None: ...

    def add_request(
        self,
        prompt: str | list[int],
        params: SamplingParams,
        on_output: OutputCallback,
        request_id: str | None = None,
    ) -> str: ...

    def abort(self, request_id: str) -> None: ...

    def stats(self) -> EngineStats: ...

    def shutdown(self, timeout: float = 5.0) -> None: ...


@runtime_checkable
class ChatRequests(Protocol):
    """An engine thread that takes the conversation itself: a remote server
    (chat_app/remote_engine.py) applies its own chat template and context limit, so the app
    sends it the messages instead of token ids."""

    def add_chat_request(
        self,
        messages: list[dict[str, str]],
        params: SamplingParams,
        on_output: OutputCallback,
        request_id: str | None = None,
    ) -> str: ...


EngineFactory = Callable[[], EngineThread]
"""Builds a (not yet started) engine thread; slow, so the app calls it off the UI thread."""
