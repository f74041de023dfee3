"""Stop conditions and streaming: what the user sees, token by token."""

from __future__ import annotations

import pytest
from engine_helpers import EOS_ID, scripted_engine

from gpu import LLM, RequestOutputKind, SamplingParams

REPLIES = {
    1: b"Hello world! STOP here, nothing more.",
    2: "Grüße aus Köln 🙂 und mehr".encode(),
    3: b"line one\nline two\n\nEND",
}


def script(seed: int, step: int) -> int:
    """Request `seed` replies with REPLIES[seed] byte by byte, then EOS."""
    reply = REPLIES[seed]
    return reply[step] if step < len(reply) else EOS_ID


def params(seed: int, **kw) -> SamplingParams:
    kw.setdefault("max_tokens", 100)
    return SamplingParams(temperature=1.0, seed=seed, **kw)


def stream(engine, prompt, p: SamplingParams) -> tuple[list[str], object]:
    p.output_kind = RequestOutputKind.DELTA
    rid = engine.add_request(prompt, p)
    pieces, last = [], None
    while engine.has_unfinished_requests():
        for out in engine.step():
            assert out.request_id == rid
            pieces.append(out.outputs[0].text)
            last = out
    return pieces, last


def test_eos_ends_the_reply_and_is_not_shown():
    out = LLM(engine=scripted_engine(script)).generate([[1, 2]], params(2))[0].outputs[0]
    assert out.text == REPLIES[2].decode()
    assert out.token_ids[-1] == EOS_ID and out.finish_reason == "stop"


@pytest.mark.parametrize(
    "stop, expected",
    [
        ("STOP", "Hello world! "),
        (["nothing", "world"], "Hello "),  # the earliest match wins
        ("! S", "Hello world"),  # split over three tokens
        ("absent", "Hello world! STOP here, nothing more."),
    ],
)
def test_stop_strings_are_cut_exactly(stop, expected):
    out = LLM(engine=scripted_engine(script)).generate([[1]], params(1, stop=stop))[0]
    assert out.outputs[0].text == expected
    if stop != "absent":
        assert out.outputs[0].finish_reason == "stop"
        assert out.outputs[0].stop_reason in ([stop] if isinstance(stop, str) else stop)


def test_streamed_text_never_shows_part_of_a_stop_string():
    pieces, last = stream(scripted_engine(script), [1], params(3, stop="\n\nEND"))
    assert "".join(pieces) == "line one\nline two"
    shown = ""
    for piece in pieces:
        shown += piece
        assert "\n\n" not in shown
    assert last.finished and last.outputs[0].finish_reason == "stop"


def test_streaming_never_emits_half_a_character():
    pieces, last = stream(scripted_engine(script), [1], params(2))
    assert "".join(pieces) == REPLIES[2].decode()
    assert all("\ufffd" not in p for p in pieces)
    assert len([p for p in pieces if p]) < len(REPLIES[2])  # multi-byte chars waited


def test_max_tokens_and_metrics():
    engine = scripted_engine(script)
    out = LLM(engine=engine).generate([[1, 2, 3]], params(1, max_tokens=5))[0]
    assert out.outputs[0].text == "Hello" and out.outputs[0].finish_reason == "length"
    m = out.metrics
    assert m.num_prompt_tokens == 3 and m.num_generated_tokens == 5
    assert m.time_to_first_token is not None and m.time_to_first_token >= 0
    assert m.inter_token_latency is not None and m.tokens_per_s > 0


def test_cumulative_outputs_grow():
    engine = scripted_engine(script)
    engine.add_request([1], params(1, max_tokens=8))
    texts = []
    while engine.has_unfinished_requests():
        texts += [o.outputs[0].text for o in engine.step()]
    assert texts[-1] == "Hello wo"
    assert all(texts[-1].startswith(t) for t in texts)


TOKENS = [97, EOS_ID, 98, 10, 99, EOS_ID, 100, 101, 102, 103]  # a, EOS, b, "\n", c, EOS, d...


def token_script(seed: int, step: int) -> int:
    return TOKENS[step % len(TOKENS)]


def finish(context: int = 64, **kw) -> tuple[list[int], str | None, object]:
    """Generate from token_script; the token ids, finish reason and stop reason."""
    engine = scripted_engine(token_script, num_kv_blocks=context, block_size=1)
    kw.setdefault("max_tokens", 20)
    out = LLM(engine=engine).generate([[1, 2]], params(0, **kw))[0].outputs[0]
    return out.token_ids, out.finish_reason, out.stop_reason


@pytest.mark.parametrize(
    "kw, tokens, reason, stop_reason",
    [
        ({}, TOKENS[:2], "stop", None),  # EOS
        ({"min_tokens": 3}, TOKENS[:6], "stop", None),  # the first EOS is too early
        ({"ignore_eos": True, "max_tokens": 8}, TOKENS[:8], "length", None),
        ({"ignore_eos": True, "stop_token_ids": [10]}, TOKENS[:4], "stop", 10),
        (
            {"ignore_eos": True, "stop_token_ids": [10], "min_tokens": 5},
            (TOKENS * 2)[:14],
            "stop",
            10,
        ),
        ({"stop_token_ids": [EOS_ID]}, TOKENS[:2], "stop", None),  # EOS wins over stop id
        ({"ignore_eos": True, "max_tokens": None, "context": 9}, TOKENS[:7], "length", None),
    ],
)
def test_each_stop_condition_ends_at_the_right_token(kw, tokens, reason, stop_reason):
    assert finish(**kw) == (tokens, reason, stop_reason)


@pytest.mark.parametrize("kind", list(RequestOutputKind))
def test_output_kinds_carry_the_same_reply(kind):
    engine = scripted_engine(script)
    engine.add_request([1], params(3, max_tokens=30, stop="two", output_kind=kind))
    outs = []
    while engine.has_unfinished_requests():
        outs += engine.step()
    assert outs[-1].finished and all(not o.finished for o in outs[:-1])
    if kind is RequestOutputKind.DELTA:
        text = "".join(o.outputs[0].text for o in outs)
        token_ids = [t for o in outs for t in o.outputs[0].token_ids]
    else:
        text, token_ids = outs[-1].outputs[0].text, outs[-1].outputs[0].token_ids
    assert len(outs) == (1 if kind is RequestOutputKind.FINAL_ONLY else len(token_ids))
    assert text == "line one\nline " and bytes(token_ids) == b"line one\nline two"


@pytest.mark.parametrize(
    "kwargs",
    [
        {"temperature": -1},
        {"top_p": 0.0},
        {"top_p": 1.5},
        {"top_k": -2},
        {"min_p": 1.5},
        {"max_tokens": 0},
        {"repetition_penalty": 0.0},
        {"presence_penalty": 3.0},
        {"frequency_penalty": -2.5},
        {"min_tokens": 5, "max_tokens": 2},
        {"seed": -1},
        {"stop": [""]},
        {"stop_token_ids": [-3]},
    ],
)
def test_invalid_sampling_params_raise_a_clear_error(kwargs):
    with pytest.raises(ValueError) as err:
        SamplingParams(**kwargs)
    assert next(iter(kwargs)).split("_")[0] in str(err.value)
