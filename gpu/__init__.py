"""The tinychat inference engine: continuous batching over a paged KV cache, on numpy or CUDA.

from gpu import LLM, SamplingParams
llm = LLM(device="cpu")
print(llm.generate("The capital of France is", SamplingParams(temperature=0))[0].text)
"""

from gpu.config import EngineConfig
from gpu.engine import LLMEngine
from gpu.llm import LLM
from gpu.outputs import CompletionOutput, EngineStats, RequestMetrics, RequestOutput, StepStats
from gpu.sampling_params import RequestOutputKind, SamplingParams

__all__ = [
    "LLM",
    "CompletionOutput",
    "EngineConfig",
    "EngineStats",
    "LLMEngine",
    "RequestMetrics",
    "RequestOutput",
    "RequestOutputKind",
    "SamplingParams",
    "StepStats",
]
