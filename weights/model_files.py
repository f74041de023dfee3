"""`open_model`: everything in a model folder, read and cross-checked in one go.

The checks are the cheap ones that catch broken folders before the engine allocates anything:
config.json is a Llama config; the tokenizer loads and fits in the embedding (a tokenizer with
more tokens than the embedding has rows belongs to another model; an embedding padded larger
than the tokenizer, as many models ship, is fine); the safetensors headers hold every tensor the
config implies, with the right shape. The tensor data itself is only memory-mapped when
`tensors()` is first called.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from .atomic import read_marker
from .checkpoint import check_llama_tensors, checkpoint_index
from .config import ModelConfig
from .errors import ModelLoadError, fail
from .generation_config import GenerationConfig
from .paths import REPAIR_HINT, hf_repo_id_of, is_default_model
from .safetensors_format import Tensor, TensorInfo, map_tensors
from .tokenizer import TOKENIZER_FILE, Tokenizer


@dataclass
class ModelFiles:
    """A checked model folder: its configs and tokenizer now, its tensors on demand."""

    folder: Path
    config: ModelConfig
    generation_config: GenerationConfig
    tokenizer: Tokenizer
    name: str
    index: dict[str, TensorInfo] = field(repr=False, default_factory=dict)
    _tensors: dict[str, Tensor] | None = field(repr=False, default=None)

    def tensors(self) -> dict[str, Tensor]:
        """Every tensor of the checkpoint by HF name, memory-mapped on first call."""
        if self._tensors is None:
            self._tensors = map_tensors(self.index.values())
        return self._tensors

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        """Every id that ends a reply: generation_config's, config's and the tokenizer's EOS."""
        ids = [*self.generation_config.eos_token_ids, *self.config.eos_token_ids]
        if self.tokenizer.eos_token_id is not None:
            ids.append(self.tokenizer.eos_token_id)
        return tuple(dict.fromkeys(ids))


def open_model(folder: Path | str) -> ModelFiles:
    """Read and check a model folder; any problem is a one-line `ModelLoadError`.

    A broken default model (tinychat made it, so tinychat can make it again) says how."""
    folder = Path(folder).expanduser()
    try:
        return _open_model(folder)
    except ModelLoadError as error:
        if not is_default_model(folder):
            raise
        raise ModelLoadError(f"{error}; {REPAIR_HINT}") from None


def _open_model(folder: Path) -> ModelFiles:
    if not folder.is_dir():
        raise fail(folder, "no such model folder")
    config = ModelConfig.from_json(folder / "config.json")
    generation_config = GenerationConfig.from_folder(folder)
    tokenizer = Tokenizer.from_folder(folder)
    if tokenizer.vocab_size > config.vocab_size:
        raise fail(
            folder / TOKENIZER_FILE,
            f"tokenizer has {tokenizer.vocab_size} tokens but config.json's vocab_size "
            f"is {config.vocab_size} (tokenizer and weights from different models?)",
        )
    ids = {*config.eos_token_ids, *generation_config.eos_token_ids}
    ids |= {i for i in (config.bos_token_id, generation_config.bos_token_id) if i is not None}
    if ids and max(ids) >= config.vocab_size:
        raise fail(
            folder / "config.json",
            f"special token id {max(ids)} is outside the vocabulary of {config.vocab_size}",
        )
    index = checkpoint_index(folder)
    check_llama_tensors(folder, index, config)
    return ModelFiles(
        folder=folder.absolute(),
        config=config,
        generation_config=generation_config,
        tokenizer=tokenizer,
        name=display_name(folder),
        index=index,
    )


def display_name(folder: Path) -> str:
    """A short name for a folder: what its converter recorded, "ORG/NAME", or the folder name."""
    marker = read_marker(folder)
    if marker:
        try:
            name = json.loads(marker).get("name")
        except (json.JSONDecodeError, AttributeError):
            name = None
        if isinstance(name, str) and name:
            return name
    return hf_repo_id_of(folder) or folder.absolute().name
