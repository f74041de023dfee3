"""SamplingParams' validation: a bad value is a ValueError that names the field, at construction."""

from __future__ import annotations

import math

import pytest

from gpu import SamplingParams

FLOAT_FIELDS = (
    "temperature",
    "top_p",
    "min_p",
    "repetition_penalty",
    "presence_penalty",
    "frequency_penalty",
)


@pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan])
@pytest.mark.parametrize("name", FLOAT_FIELDS)
def test_non_finite_floats_are_refused_by_name(name: str, value: float) -> None:
    with pytest.raises(ValueError, match=rf"^{name} must be a finite number, got {value!r}$"):
        SamplingParams(**{name: value})


@pytest.mark.parametrize("name", FLOAT_FIELDS)
def test_a_float_field_must_be_a_number(name: str) -> None:
    with pytest.raises(ValueError, match=rf"^{name} must be a finite number"):
        SamplingParams(**{name: "0.5"})


def test_large_finite_values_still_reach_the_range_checks() -> None:
    assert SamplingParams(temperature=1e6, repetition_penalty=1e6).temperature == 1e6
    with pytest.raises(ValueError, match="top_p must be in"):
        SamplingParams(top_p=1e6)


@pytest.mark.parametrize("stop", [5, 1.5, object(), ["a", 5], [None]])
def test_stop_of_the_wrong_type_is_a_value_error(stop: object) -> None:
    with pytest.raises(ValueError, match="^stop must be a string or a list of strings"):
        SamplingParams(stop=stop)


def test_stop_accepts_a_string_or_a_list_of_strings() -> None:
    assert SamplingParams(stop="END").stop_strings == ("END",)
    assert SamplingParams(stop=["a", "b"]).stop_strings == ("a", "b")
    assert SamplingParams(stop=("a",)).stop_strings == ("a",)
    assert SamplingParams(stop=None).stop_strings == ()
    with pytest.raises(ValueError, match="non-empty"):
        SamplingParams(stop=["a", ""])


@pytest.mark.parametrize("ids", [5, "12", [1, "2"], [1.0], [-1], [True]])
def test_stop_token_ids_of_the_wrong_type_is_a_value_error(ids: object) -> None:
    with pytest.raises(ValueError, match="^stop_token_ids must be a list of non-negative integers"):
        SamplingParams(stop_token_ids=ids)


def test_stop_token_ids_accepts_a_list_of_integers() -> None:
    assert SamplingParams(stop_token_ids=[7, 0]).all_stop_token_ids == (7, 0)
    assert SamplingParams(stop_token_ids=(3,)).all_stop_token_ids == (3,)
    assert SamplingParams().all_stop_token_ids == ()
