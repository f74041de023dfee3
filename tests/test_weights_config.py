"""config.json and generation_config.json parsing: every spelling real models use, and refusals."""

from __future__ import annotations

import json

import pytest

from weights import GenerationConfig, ModelConfig, ModelLoadError, RopeScaling

# Llama-3.2-1B-Instruct's config.json as published (transformers 4.45 spelling).
LLAMA32_1B = {
    "architectures": ["LlamaForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 128000,
    "eos_token_id": [128001, 128008, 128009],
    "head_dim": 64,
    "hidden_act": "silu",
    "hidden_size": 2048,
    "initializer_range": 0.02,
    "intermediate_size": 8192,
    "max_position_embeddings": 131072,
    "mlp_bias": False,
    "model_type": "llama",
    "num_attention_heads": 32,
    "num_hidden_layers": 16,
    "num_key_value_heads": 8,
    "pretraining_tp": 1,
    "rms_norm_eps": 1e-05,
    "rope_scaling": {
        "factor": 32.0,
        "high_freq_factor": 4.0,
        "low_freq_factor": 1.0,
        "original_max_position_embeddings": 8192,
        "rope_type": "llama3",
    },
    "rope_theta": 500000.0,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.45.0.dev0",
    "use_cache": True,
    "vocab_size": 128256,
}

SMOLLM2_135M = {
    "architectures": ["LlamaForCausalLM"],
    "bos_token_id": 1,
    "eos_token_id": 2,
    "hidden_act": "silu",
    "hidden_size": 576,
    "intermediate_size": 1536,
    "max_position_embeddings": 8192,
    "model_type": "llama",
    "num_attention_heads": 9,
    "num_hidden_layers": 30,
    "num_key_value_heads": 3,
    "rms_norm_eps": 1e-05,
    "rope_scaling": None,
    "rope_theta": 100000,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
    "vocab_size": 49152,
}


def test_llama32_config() -> None:
    c = ModelConfig.from_dict(LLAMA32_1B)
    assert c.rope_scaling == RopeScaling("llama3", 32.0, 1.0, 4.0, 8192)
    assert c.eos_token_ids == (128001, 128008, 128009)
    assert (c.num_attention_heads, c.num_key_value_heads, c.head_dim) == (32, 8, 64)
    assert c.tie_word_embeddings and c.rope_theta == 500000.0 and c.bos_token_id == 128000
    assert c.max_position_embeddings == 131072 and c.torch_dtype == "bfloat16"


def test_smollm2_config_defaults_head_dim_and_single_eos() -> None:
    c = ModelConfig.from_dict(SMOLLM2_135M)
    assert c.head_dim == 576 // 9 == 64
    assert c.eos_token_ids == (2,)
    assert c.rope_scaling is None and isinstance(c.rope_theta, float)


def test_minimal_config_gets_hf_defaults() -> None:
    c = ModelConfig.from_dict(
        {
            "model_type": "llama",
            "vocab_size": 100,
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 1,
            "num_attention_heads": 4,
        }
    )
    assert c.num_key_value_heads == 4 and c.head_dim == 8
    assert c.rms_norm_eps == 1e-6 and c.rope_theta == 10000.0
    assert c.max_position_embeddings == 2048 and not c.tie_word_embeddings
    assert c.eos_token_ids == () and c.bos_token_id is None


def test_head_dim_null_means_default() -> None:
    c = ModelConfig.from_dict({**SMOLLM2_135M, "head_dim": None})
    assert c.head_dim == 64


def test_explicit_head_dim_wins() -> None:
    c = ModelConfig.from_dict({**SMOLLM2_135M, "head_dim": 128})
    assert c.head_dim == 128


def test_transformers5_spelling_rope_parameters_and_dtype() -> None:
    d = {k: v for k, v in LLAMA32_1B.items() if k not in ("rope_scaling", "rope_theta")}
    d.pop("torch_dtype")
    d["dtype"] = "float16"
    d["rope_parameters"] = {**LLAMA32_1B["rope_scaling"], "rope_theta": 500000.0}
    c = ModelConfig.from_dict(d)
    assert c.rope_theta == 500000.0 and c.rope_scaling.rope_type == "llama3"
    assert c.rope_scaling.factor == 32.0 and c.torch_dtype == "float16"
    plain = dict(d, rope_parameters={"rope_type": "default", "rope_theta": 1e4})
    assert ModelConfig.from_dict(plain).rope_scaling is None


def test_legacy_rope_type_key_and_linear() -> None:
    c = ModelConfig.from_dict({**SMOLLM2_135M, "rope_scaling": {"type": "linear", "factor": 2}})
    assert c.rope_scaling == RopeScaling("linear", factor=2.0)


@pytest.mark.parametrize("rope_type", ["yarn", "dynamic", "longrope"])
def test_unknown_rope_types_are_refused(rope_type: str) -> None:
    with pytest.raises(ModelLoadError, match=f"rope_scaling type '{rope_type}'"):
        ModelConfig.from_dict({**SMOLLM2_135M, "rope_scaling": {"rope_type": rope_type}})
    with pytest.raises(ModelLoadError):
        RopeScaling(rope_type)


@pytest.mark.parametrize(
    "change, message",
    [
        ({"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]}, "not a Llama"),
        ({"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"]}, "not a Llama"),
        ({"architectures": ["LlamaForSequenceClassification"]}, "not supported"),
        ({"attention_bias": True}, "attention_bias"),
        ({"mlp_bias": True}, "mlp_bias"),
        ({"torch_dtype": "int8"}, "unknown dtype"),
        ({"hidden_act": "gelu"}, "hidden_act"),
        ({"num_key_value_heads": 4}, "multiple"),
        ({"hidden_size": 0}, "hidden_size"),
        ({"vocab_size": "many"}, "vocab_size"),
        ({"eos_token_id": "x"}, "eos_token_id"),
        ({"quantization_config": {"quant_method": "gptq"}}, "gptq"),
    ],
)
def test_bad_configs_are_refused(change: dict, message: str) -> None:
    with pytest.raises(ModelLoadError, match=message) as info:
        ModelConfig.from_dict({**SMOLLM2_135M, **change})
    assert "\n" not in str(info.value)


def test_missing_required_key() -> None:
    d = dict(SMOLLM2_135M)
    del d["hidden_size"]
    with pytest.raises(ModelLoadError, match="missing 'hidden_size'"):
        ModelConfig.from_dict(d)


def test_mistral_without_sliding_window_is_llama_but_with_one_is_not() -> None:
    mistral = {**SMOLLM2_135M, "model_type": "mistral", "architectures": ["MistralForCausalLM"]}
    assert ModelConfig.from_dict({**mistral, "sliding_window": None}).model_type == "mistral"
    with pytest.raises(ModelLoadError, match="sliding_window"):
        ModelConfig.from_dict({**mistral, "sliding_window": 4096})


def test_from_json_names_the_file(tmp_path) -> None:
    path = tmp_path / "config.json"
    path.write_text("{not json")
    with pytest.raises(ModelLoadError, match=str(path)):
        ModelConfig.from_json(path)
    with pytest.raises(ModelLoadError, match="no config.json"):
        ModelConfig.from_json(tmp_path / "missing" / "config.json")
    path.write_text(json.dumps({**SMOLLM2_135M, "model_type": "bert"}))
    with pytest.raises(ModelLoadError, match=f"{path}: model_type 'bert'"):
        ModelConfig.from_json(path)


@pytest.mark.parametrize("original", [LLAMA32_1B, SMOLLM2_135M])
def test_to_dict_round_trips_and_is_hf_shaped(original: dict) -> None:
    c = ModelConfig.from_dict(original)
    d = c.to_dict()
    assert d["architectures"] == ["LlamaForCausalLM"] and d["model_type"] == "llama"
    assert ModelConfig.from_dict(d) == c
    for key in ("vocab_size", "hidden_size", "num_key_value_heads", "eos_token_id"):
        assert d[key] == original[key]
    assert d["rope_scaling"] == original["rope_scaling"]
    json.dumps(d)  # plain JSON types only


def test_generation_config_absent_gives_defaults(tmp_path) -> None:
    g = GenerationConfig.from_folder(tmp_path)
    assert g == GenerationConfig()
    assert g.temperature is None and g.top_p is None and g.top_k is None
    assert g.eos_token_ids == () and g.bos_token_id is None and g.max_new_tokens is None


def test_generation_config_of_llama32(tmp_path) -> None:
    (tmp_path / "generation_config.json").write_text(
        json.dumps(
            {
                "bos_token_id": 128000,
                "do_sample": True,
                "eos_token_id": [128001, 128008, 128009],
                "temperature": 0.6,
                "top_p": 0.9,
                "transformers_version": "4.45.0.dev0",
            }
        )
    )
    g = GenerationConfig.from_folder(tmp_path)
    assert (g.temperature, g.top_p, g.top_k, g.do_sample) == (0.6, 0.9, None, True)
    assert g.eos_token_ids == (128001, 128008, 128009) and g.bos_token_id == 128000
    assert GenerationConfig.from_dict(g.to_dict()) == g


def test_generation_config_single_eos_and_bad_file(tmp_path) -> None:
    path = tmp_path / "generation_config.json"
    path.write_text(json.dumps({"eos_token_id": 2, "top_k": 50, "repetition_penalty": 1.1}))
    g = GenerationConfig.from_folder(tmp_path)
    assert g.eos_token_ids == (2,) and g.top_k == 50 and g.repetition_penalty == 1.1
    path.write_text("[1, 2")
    with pytest.raises(ModelLoadError, match="generation_config.json"):
        GenerationConfig.from_folder(tmp_path)
