"""The GGUF -> HF converter on small GGUFs written here with gguf.GGUFWriter.

Checks values against gguf's own dequantize, the q/k un-permutation against llama.cpp's
permutation done by hand, the config and tokenizer rebuilt from metadata, clear refusals, and
the temp-folder-then-rename behaviour.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import gguf
import numpy as np
import pytest

from weights import ModelLoadError, bf16_bits_to_float32, convert_gguf, open_model, resolve_model
from weights import gguf_convert as gc
from weights.atomic import MARKER
from weights.bf16 import float32_to_bf16_bits

Q = gguf.GGMLQuantizationType
LAYERS, HIDDEN, HEADS, KV_HEADS, FF = 2, 64, 4, 2, 96
HEAD_DIM = HIDDEN // HEADS
CHAT_TEMPLATE = "{% for m in messages %}<|im_start|>{{ m['content'] }}<|im_end|>{% endfor %}"


def bytes_to_unicode() -> list[str]:
    """GPT-2's byte -> character table, in byte order (the spelling of byte-level tokens)."""
    printable = [*range(33, 127), *range(161, 173), *range(174, 256)]
    others = [b for b in range(256) if b not in printable]
    table = {b: chr(b) for b in printable} | {b: chr(256 + i) for i, b in enumerate(others)}
    return [table[b] for b in range(256)]


SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MERGED = ["Ġt", "he", "Ġthe"]
TOKENS = SPECIALS + bytes_to_unicode() + MERGED
TOKEN_TYPES = [3] * len(SPECIALS) + [1] * (256 + len(MERGED))
MERGES = ["Ġ t", "h e", "Ġt he"]
VOCAB = len(TOKENS)


def llama_cpp_permute(w: np.ndarray, n_heads: int) -> np.ndarray:
    """What llama.cpp's convert_hf_to_gguf.py does to q/k rows (written out independently)."""
    out = np.empty_like(w)
    head_dim = w.shape[0] // n_heads
    for h in range(n_heads):
        for i in range(head_dim // 2):
            # HF pairs row i with row i + head_dim/2 (rotate-half); llama.cpp wants them adjacent.
            out[h * head_dim + 2 * i] = w[h * head_dim + i]
            out[h * head_dim + 2 * i + 1] = w[h * head_dim + head_dim // 2 + i]
    return out


def hf_weights(seed: int = 0, tied: bool = True) -> dict[str, np.ndarray]:
    """Random weights in HF layout (the truth the converter must recover)."""
    rng = np.random.default_rng(seed)
    w = {"model.embed_tokens.weight": rng.standard_normal((VOCAB, HIDDEN), dtype=np.float32)}
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        shapes = {
            "input_layernorm.weight": (HIDDEN,),
            "self_attn.q_proj.weight": (HEADS * HEAD_DIM, HIDDEN),
            "self_attn.k_proj.weight": (KV_HEADS * HEAD_DIM, HIDDEN),
            "self_attn.v_proj.weight": (KV_HEADS * HEAD_DIM, HIDDEN),
            "self_attn.o_proj.weight": (HIDDEN, HEADS * HEAD_DIM),
            "post_attention_layernorm.weight": (HIDDEN,),
            "mlp.gate_proj.weight": (FF, HIDDEN),
            "mlp.up_proj.weight": (FF, HIDDEN),
            "mlp.down_proj.weight": (HIDDEN, FF),
        }
        for name, shape in shapes.items():
            w[p + name] = rng.standard_normal(shape, dtype=np.float32)
    w["model.norm.weight"] = rng.standard_normal(HIDDEN, dtype=np.float32)
    if not tied:
        w["lm_head.weight"] = rng.standard_normal((VOCAB, HIDDEN), dtype=np.float32)
    return w


GGUF_NAME = {hf: g for g, hf in gc._GLOBAL_NAMES.items()} | {
    f"model.layers.{i}.{hf}": f"blk.{i}.{g}"
    for i in range(LAYERS)
    for g, hf in gc._LAYER_NAMES.items()
}


def write_gguf(
    path: Path,
    weights: dict[str, np.ndarray],
    qtype: Q = Q.F32,
    *,
    arch: str = "llama",
    pre: str = "smollm",
    tokenizer_model: str = "gpt2",
    extra: dict[str, np.ndarray] | None = None,
    metadata: dict[str, object] | None = None,
    skip: tuple[str, ...] = (),
) -> Path:
    """A GGUF holding `weights` (q/k permuted as llama.cpp does), matrices stored as `qtype`."""
    w = gguf.GGUFWriter(path, arch)
    meta = {
        f"{arch}.block_count": LAYERS,
        f"{arch}.context_length": 512,
        f"{arch}.embedding_length": HIDDEN,
        f"{arch}.feed_forward_length": FF,
        f"{arch}.attention.head_count": HEADS,
        f"{arch}.attention.head_count_kv": KV_HEADS,
        f"{arch}.rope.freq_base": 10000.0,
        f"{arch}.attention.layer_norm_rms_epsilon": 1e-5,
        f"{arch}.rope.dimension_count": HEAD_DIM,
        **(metadata or {}),
    }
    for key, value in meta.items():
        if key in skip:
            continue
        if isinstance(value, float):
            w.add_float32(key, value)
        elif isinstance(value, str):
            w.add_string(key, value)
        else:
            w.add_uint32(key, value)
    w.add_tokenizer_model(tokenizer_model)
    w.add_tokenizer_pre(pre)
    w.add_token_list(TOKENS)
    w.add_token_types(TOKEN_TYPES)
    w.add_token_merges(MERGES)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_add_bos_token(False)
    w.add_chat_template(CHAT_TEMPLATE)
    for hf, values in weights.items():
        if hf.endswith("q_proj.weight"):
            values = llama_cpp_permute(values, HEADS)
        elif hf.endswith("k_proj.weight"):
            values = llama_cpp_permute(values, KV_HEADS)
        if values.ndim == 1 or qtype == Q.F32:
            w.add_tensor(GGUF_NAME[hf], values)
        elif qtype == Q.F16:
            w.add_tensor(GGUF_NAME[hf], values.astype(np.float16))
        else:
            w.add_tensor(GGUF_NAME[hf], gguf.quants.quantize(values, qtype), raw_dtype=qtype)
    for name, values in (extra or {}).items():
        w.add_tensor(name, values)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def converted_f32(folder: Path) -> dict[str, np.ndarray]:
    return {name: t.float32() for name, t in open_model(folder).tensors().items()}


def bf16(x: np.ndarray) -> np.ndarray:
    return bf16_bits_to_float32(float32_to_bf16_bits(x))


def test_f32_gguf_converts_exactly(tmp_path: Path) -> None:
    truth = hf_weights()
    src = write_gguf(tmp_path / "tiny.gguf", truth)
    steps: list[tuple[str, int, int]] = []
    out = convert_gguf(src, tmp_path / "out", progress=lambda *a: steps.append(a), name="tiny")
    got = converted_f32(out)
    assert set(got) == set(truth)  # tied: no lm_head
    for name, values in truth.items():
        # Only rounding to bf16 may change a value: q/k rows are back in HF order.
        np.testing.assert_array_equal(got[name], bf16(values), err_msg=name)
    assert len(steps) == len(truth) + 1 and steps[-1][1] == steps[-1][2] == len(truth)
    assert steps[0][0] == "converting token_embd.weight"


def test_config_and_generation_config(tmp_path: Path) -> None:
    out = convert_gguf(write_gguf(tmp_path / "t.gguf", hf_weights()), tmp_path / "out")
    m = open_model(out)
    c = m.config
    assert (c.vocab_size, c.hidden_size, c.intermediate_size) == (VOCAB, HIDDEN, FF)
    assert (c.num_hidden_layers, c.num_attention_heads, c.num_key_value_heads) == (2, 4, 2)
    assert c.head_dim == HEAD_DIM and c.rms_norm_eps == 1e-5 and c.rope_theta == 10000.0
    assert c.max_position_embeddings == 512 and c.tie_word_embeddings
    assert c.bos_token_id == 1 and c.eos_token_ids == (2,) and c.rope_scaling is None
    assert m.generation_config.eos_token_ids == (2,)
    raw = json.loads((out / "config.json").read_text())
    assert raw["architectures"] == ["LlamaForCausalLM"] and raw["torch_dtype"] == "bfloat16"
    assert m.name == "t"  # the GGUF has no general.name: its file name


@pytest.mark.parametrize("qtype", [Q.F16, Q.BF16, Q.Q8_0, Q.Q4_0, Q.Q4_1])
def test_quantized_tensors_match_gguf_dequantize(tmp_path: Path, qtype: Q) -> None:
    truth = hf_weights(seed=1)
    src = write_gguf(tmp_path / "q.gguf", truth, qtype)
    got = converted_f32(convert_gguf(src, tmp_path / "out"))
    reader = gguf.GGUFReader(src)
    stored = {t.name: t for t in reader.tensors}
    for name, values in truth.items():
        t = stored[GGUF_NAME[name]]
        assert t.tensor_type == (Q.F32 if values.ndim == 1 else qtype)
        want = gguf.quants.dequantize(t.data, t.tensor_type).reshape(values.shape)
        if name.endswith("q_proj.weight"):
            want = gc.unpermute_rows(want, HEADS)
        elif name.endswith("k_proj.weight"):
            want = gc.unpermute_rows(want, KV_HEADS)
        np.testing.assert_array_equal(got[name], bf16(want), err_msg=name)
        # ...and that is the original up to the quantization error (rows in the right order).
        tolerance = {Q.F16: 0.01, Q.BF16: 0.02, Q.Q8_0: 0.05, Q.Q4_0: 0.6, Q.Q4_1: 0.6}[qtype]
        assert np.abs(got[name] - values).max() < tolerance * np.abs(values).max(), name


def test_unpermute_inverts_llama_cpp_permute() -> None:
    rng = np.random.default_rng(2)
    for heads in (1, 3, 8):
        w = rng.standard_normal((heads * 16, 24)).astype(np.float32)
        np.testing.assert_array_equal(gc.unpermute_rows(llama_cpp_permute(w, heads), heads), w)
    # The brief's formula, literally: reshape(n_heads, head_dim // 2, 2, in).swapaxes(1, 2).
    w = np.arange(8 * 3).reshape(8, 3)
    assert gc.unpermute_rows(w, 1)[:, 0].tolist() == [0, 6, 12, 18, 3, 9, 15, 21]


def test_untied_output_becomes_lm_head(tmp_path: Path) -> None:
    truth = hf_weights(tied=False)
    out = convert_gguf(write_gguf(tmp_path / "u.gguf", truth), tmp_path / "out")
    m = open_model(out)
    assert not m.config.tie_word_embeddings
    np.testing.assert_array_equal(
        m.tensors()["lm_head.weight"].float32(), bf16(truth["lm_head.weight"])
    )


def test_tokenizer_rebuilt_from_gguf(tmp_path: Path) -> None:
    out = convert_gguf(write_gguf(tmp_path / "t.gguf", hf_weights()), tmp_path / "out")
    tok = open_model(out).tokenizer
    assert tok.vocab_size == VOCAB
    assert (tok.bos_token, tok.eos_token) == ("<|im_start|>", "<|im_end|>")
    assert tok.all_special_ids == {0, 1, 2}
    ids = tok.encode(" the 2024<|im_end|>")
    the = TOKENS.index("Ġthe")
    digit = {str(d): 3 + ord(str(d)) for d in range(10)}  # byte tokens come after the 3 specials
    assert ids == [the, 3 + ord(" "), digit["2"], digit["0"], digit["2"], digit["4"], 2]
    assert tok.decode(ids) == " the 2024"
    assert tok.decode(ids, skip_special_tokens=False) == " the 2024<|im_end|>"
    assert tok.chat_template == CHAT_TEMPLATE
    text = "héllo 😀\r\n\tдобрый"
    assert tok.decode(tok.encode(text)) == text


def test_llama_bpe_pre_tokenizer(tmp_path: Path) -> None:
    out = convert_gguf(
        write_gguf(tmp_path / "l.gguf", hf_weights(), pre="llama-bpe"), tmp_path / "out"
    )
    tok = open_model(out).tokenizer
    pieces = [p for p, _ in tok.backend.pre_tokenizer.pre_tokenize_str("abc 12345 don't")]
    assert pieces == ["abc", "Ġ", "123", "45", "Ġdon", "'t"]
    assert tok.decode(tok.encode("abc 12345")) == "abc 12345"


def test_llama3_rope_freqs_become_rope_scaling(tmp_path: Path) -> None:
    from weights import RopeScaling

    rope = RopeScaling("llama3", 32.0, 1.0, 4.0, 8192)
    factors = gc.llama3_rope_factors(500000.0, HEAD_DIM, rope).astype(np.float32)
    meta = {"llama.rope.freq_base": 500000.0}
    src = write_gguf(
        tmp_path / "r.gguf", hf_weights(), extra={"rope_freqs.weight": factors}, metadata=meta
    )
    m = open_model(convert_gguf(src, tmp_path / "out"))
    assert m.config.rope_scaling == rope and m.config.rope_theta == 500000.0
    assert "rope_freqs.weight" not in m.tensors()
    bad = write_gguf(
        tmp_path / "bad.gguf",
        hf_weights(),
        extra={"rope_freqs.weight": factors * 1.5},
        metadata=meta,
    )
    with pytest.raises(ModelLoadError, match="rope_freqs does not match"):
        convert_gguf(bad, tmp_path / "out2")


def test_linear_rope_scaling_from_metadata(tmp_path: Path) -> None:
    meta = {"llama.rope.scaling.type": "linear", "llama.rope.scaling.factor": 4.0}
    src = write_gguf(tmp_path / "r.gguf", hf_weights(), metadata=meta)
    assert open_model(convert_gguf(src, tmp_path / "o")).config.rope_scaling.factor == 4.0
    yarn = write_gguf(
        tmp_path / "y.gguf", hf_weights(), metadata={"llama.rope.scaling.type": "yarn"}
    )
    with pytest.raises(ModelLoadError, match="rope scaling 'yarn' is not supported"):
        convert_gguf(yarn, tmp_path / "o2")


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"arch": "qwen2"}, "general.architecture is 'qwen2'; only llama"),
        ({"tokenizer_model": "llama"}, "SentencePiece GGUF vocabularies"),
        ({"tokenizer_model": "bert"}, "tokenizer model 'bert' is not supported"),
        ({"pre": "qwen2"}, "pre-tokenizer 'qwen2' is not supported"),
        ({"extra": {"blk.0.attn_q.bias": np.zeros(64, np.float32)}}, "unexpected tensor"),
        ({"extra": {"blk.0.attn_q_norm.weight": np.zeros(4, np.float32)}}, "unexpected tensor"),
        ({"skip": ("llama.embedding_length",)}, "no 'llama.embedding_length'"),
    ],
)
def test_refusals(tmp_path: Path, kwargs: dict, message: str) -> None:
    src = write_gguf(tmp_path / "x.gguf", hf_weights(), **kwargs)
    with pytest.raises(ModelLoadError, match=message) as info:
        convert_gguf(src, tmp_path / "out")
    assert str(src) in str(info.value) and "\n" not in str(info.value)
    assert not (tmp_path / "out").exists()


def test_unsupported_tensor_type(tmp_path: Path) -> None:
    truth = hf_weights()
    src = tmp_path / "f64.gguf"
    truth["model.norm.weight"] = truth["model.norm.weight"].astype(np.float64)
    write_gguf(src, truth)
    with pytest.raises(ModelLoadError, match="output_norm.weight' is F64, which cannot be"):
        convert_gguf(src, tmp_path / "out")


def test_missing_tensor(tmp_path: Path) -> None:
    truth = hf_weights()
    del truth["model.layers.1.mlp.up_proj.weight"]
    with pytest.raises(ModelLoadError, match="no tensor for model.layers.1.mlp.up_proj.weight"):
        convert_gguf(write_gguf(tmp_path / "m.gguf", truth), tmp_path / "out")


def test_not_a_gguf(tmp_path: Path) -> None:
    (tmp_path / "fake.gguf").write_bytes(b"not a gguf file at all" * 10)
    with pytest.raises(ModelLoadError, match="not a readable GGUF file"):
        convert_gguf(tmp_path / "fake.gguf", tmp_path / "out")
    with pytest.raises(ModelLoadError, match="no such GGUF file"):
        convert_gguf(tmp_path / "missing.gguf", tmp_path / "out")


def leftovers(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if ".tmp-" in p.name)


def test_interrupted_conversion_leaves_nothing(tmp_path: Path, monkeypatch) -> None:
    src = write_gguf(tmp_path / "t.gguf", hf_weights())
    calls = []

    def explode(*args, **kwargs):
        calls.append(1)
        if len(calls) == 5:
            raise KeyboardInterrupt  # like Ctrl-C in the middle of the tensors
        return real(*args, **kwargs)

    real = gc._dequantize
    monkeypatch.setattr(gc, "_dequantize", explode)
    with pytest.raises(KeyboardInterrupt):
        convert_gguf(src, tmp_path / "models" / "t")
    assert not (tmp_path / "models" / "t").exists()
    assert leftovers(tmp_path / "models") == []


def dead_pid() -> int:
    proc = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    return int(proc.stdout)  # that process has exited


def test_stale_temp_folders_are_cleaned_and_live_ones_kept(tmp_path: Path) -> None:
    import os

    models = tmp_path / "models"
    stale = models / f".t.tmp-{dead_pid()}-deadbeef"
    live = models / f".t.tmp-{os.getppid()}-cafebabe"  # our parent process is alive
    stale.mkdir(parents=True)
    live.mkdir()
    (stale / "model.safetensors").write_bytes(b"half")
    convert_gguf(write_gguf(tmp_path / "t.gguf", hf_weights()), models / "t")
    assert not stale.exists() and live.exists()
    assert (models / "t" / MARKER).is_file()


def test_existing_destination_is_replaced(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "old-file").write_text("old")
    convert_gguf(write_gguf(tmp_path / "t.gguf", hf_weights()), out)
    assert not (out / "old-file").exists() and (out / "model.safetensors").is_file()
    assert leftovers(tmp_path) == []


def test_resolve_model_converts_a_gguf_once(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("TINYCHAT_HOME", str(tmp_path / "home"))
    src = write_gguf(tmp_path / "My-Model.Q8_0.gguf", hf_weights(), Q.Q8_0)
    folder = resolve_model(str(src))
    assert folder == tmp_path / "home" / "models" / "My-Model.Q8_0"
    assert open_model(folder).name == "My-Model.Q8_0"

    def must_not_run(*args, **kwargs):
        raise AssertionError("converted twice")

    monkeypatch.setattr("weights.resolve.convert_gguf", must_not_run)
    assert resolve_model(str(src)) == folder
    assert resolve_model("My-Model.Q8_0") == folder  # by name, from the cache
