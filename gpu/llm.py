"""`LLM`: vLLM's offline entry point. Give it prompts, get completions, in input order."""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable, Sequence
from typing import Any

from gpu.config import EngineConfig
from gpu.engine import LLMEngine
from gpu.loader import create_engine
from gpu.outputs import RequestOutput
from gpu.sampling_params import RequestOutputKind, SamplingParams

Message = dict[str, str]


class LLM:
    """An engine plus the static-batch conveniences `generate` and `chat`.

    model: a folder, a repo id in the local Hugging Face cache, a .gguf file, or None for the
    default model (downloaded and converted on first use). device: "cpu", "cuda" or "auto".
    Other keyword arguments are EngineConfig fields (max_num_seqs, max_model_len, ...).
    """

    def __init__(
        self,
        model: str | None = None,
        device: str = "auto",
        *,
        progress: Callable[[str, int, int], None] | None = None,
        engine: LLMEngine | None = None,
        **engine_args: Any,
    ) -> None:
        self.llm_engine = engine or create_engine(
            model, device, EngineConfig(**engine_args), progress=progress
        )

    def get_tokenizer(self) -> Any:
        return self.llm_engine.tokenizer

    def generate(
        self,
        prompts: str | list[int] | Sequence[str] | Sequence[list[int]],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = False,
    ) -> list[RequestOutput]:
        """Run all prompts together (continuous batching) and return results in input order.

        prompts: a string, a list of token ids, or a list of either. sampling_params: one for
        all, or one per prompt.
        """
        if isinstance(prompts, str) or (
            isinstance(prompts, list) and prompts and isinstance(prompts[0], int)
        ):
            prompts = [prompts]  # type: ignore[list-item]
        prompts = list(prompts)
        if sampling_params is None:
            sampling_params = SamplingParams()
        if isinstance(sampling_params, SamplingParams):
            params_list = [sampling_params] * len(prompts)
        else:
            params_list = list(sampling_params)
            if len(params_list) != len(prompts):
                raise ValueError(
                    f"{len(params_list)} sampling params given for {len(prompts)} prompts"
                )
        return self._run(prompts, params_list, use_tqdm)

    def chat(
        self,
        messages: list[Message] | list[list[Message]],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = False,
        add_generation_prompt: bool = True,
    ) -> list[RequestOutput]:
        """Apply the model's chat template to one conversation (or a list of them) and generate."""
        conversations = [messages] if messages and isinstance(messages[0], dict) else messages
        tok = self.get_tokenizer()
        prompts = [
            tok.apply_chat_template(c, add_generation_prompt=add_generation_prompt, tokenize=True)
            for c in conversations  # type: ignore[union-attr]
        ]
        return self.generate(prompts, sampling_params, use_tqdm)

    def _run(
        self, prompts: list[Any], params_list: list[SamplingParams], use_tqdm: bool
    ) -> list[RequestOutput]:
        engine = self.llm_engine
        ids = []
        for prompt, params in zip(prompts, params_list, strict=True):
            if params.output_kind is not RequestOutputKind.FINAL_ONLY:
                params = dataclasses.replace(params, output_kind=RequestOutputKind.FINAL_ONLY)
            ids.append(engine.add_request(prompt, params))
        results: dict[str, RequestOutput] = {}
        progress = _Progress(len(ids)) if use_tqdm else None
        try:
            while engine.has_unfinished_requests():
                for out in engine.step():
                    if out.finished:
                        results[out.request_id] = out
                        if progress:
                            progress.update(len(results))
        except BaseException:
            engine.abort_request([i for i in ids if i not in results])
            raise
        finally:
            if progress:
                progress.close()
        return [results[i] for i in ids]


class _Progress:
    """A one-line progress bar over requests on stderr, like vLLM's."""

    def __init__(self, total: int) -> None:
        import time

        self.total, self.start, self._time = total, time.monotonic(), time.monotonic

    def update(self, done: int) -> None:
        elapsed = self._time() - self.start
        width = 30
        filled = int(width * done / max(self.total, 1))
        bar = "#" * filled + "-" * (width - filled)
        rate = done / elapsed if elapsed > 0 else 0.0
        sys.stderr.write(f"\rProcessed prompts [{bar}] {done}/{self.total} ({rate:.2f} it/s)")
        sys.stderr.flush()

    def close(self) -> None:
        sys.stderr.write("\n")
        sys.stderr.flush()
