"""`tinychat`'s app options and run_app's checks before the UI opens."""

from __future__ import annotations

import argparse

import pytest

from chat_app.launch import add_app_arguments, app_cpu_threads, run_app, settings_from_args
from chat_app.session import ChatSettings
from chat_app.terminal_keys import read_escape_digit_as_alt


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_app_arguments(parser)
    return parser.parse_args(list(argv))


def test_defaults_are_the_chat_settings_defaults() -> None:
    args = parse()
    assert settings_from_args(args) == ChatSettings()
    assert (args.fresh, args.resume, args.keymap) == (False, None, None)


def test_every_option_reaches_the_settings() -> None:
    args = parse(
        "--system", "Be brief.", "--temperature", "0", "--top-p", "0.5", "--top-k", "7",
        "--min-p", "0.1", "--max-tokens", "64", "--seed", "3", "--repetition-penalty", "1.3",
        "--fresh", "--resume", "12",
    )  # fmt: skip
    assert settings_from_args(args) == ChatSettings(
        system_prompt="Be brief.", temperature=0.0, top_p=0.5, top_k=7, min_p=0.1,
        max_tokens=64, seed=3, repetition_penalty=1.3,
    )  # fmt: skip
    assert (args.fresh, args.resume) == (True, 12)


def test_invalid_settings_stop_before_the_ui_opens(capsys) -> None:
    with pytest.raises(ValueError, match="temperature"):
        settings_from_args(parse("--temperature", "-1"))
    assert run_app(parse("--top-p", "0")) == 1  # a bad option value: status 1 (README)
    assert "tinychat: error: top_p must be in (0, 1], got 0.0" in capsys.readouterr().err


@pytest.mark.parametrize("digit", "19")
def test_escape_digit_reads_as_alt_digit_for_the_tab_shortcuts(digit: str) -> None:
    """What xterm, GNOME Terminal or tmux send for Alt+1 reaches the app as alt+1."""
    from textual._xterm_parser import XTermParser

    read_escape_digit_as_alt()
    parser = XTermParser()
    events = [*parser.feed(f"\x1b{digit}"), *parser.feed("")]  # "" : no more bytes came
    assert [event.key for event in events] == [f"alt+{digit}"]


def test_keymap_file_is_read_and_bad_ones_are_reported(tmp_path) -> None:
    from chat_app.keymap import load_keymap

    assert load_keymap(tmp_path / "missing.json")[0] == {}  # and a notice: test_keymap.py
    good = tmp_path / "keymap.json"
    good.write_text('{"new_chat": "ctrl+t", "close_chat": "ctrl+x,f8"}')
    assert load_keymap(good) == ({"new_chat": "ctrl+t", "close_chat": "ctrl+x,f8"}, None)
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    keymap, error = load_keymap(broken)
    assert keymap == {} and error is not None and str(broken) in error
    wrong = tmp_path / "wrong.json"
    wrong.write_text('["new_chat", "ctrl+t"]')
    keymap, error = load_keymap(wrong)
    assert keymap == {} and error is not None and "binding_id" in error


def test_an_app_that_crashes_exits_with_status_1(tmp_path, monkeypatch) -> None:
    """Textual's run() returns None after a crash; the status must still say it failed."""
    from textual.app import App

    from chat_app.app import TinyChatApp

    def crash(self) -> None:
        raise RuntimeError("a bug")

    monkeypatch.setenv("TINYCHAT_HOME", str(tmp_path))
    monkeypatch.setattr(TinyChatApp, "on_mount", crash)
    monkeypatch.setattr(TinyChatApp, "run", lambda self: App.run(self, headless=True))
    assert run_app(parse()) == 1


@pytest.mark.parametrize(("cores", "threads"), [(1, 1), (2, 2), (3, 2), (8, 7)])
def test_the_app_engine_leaves_the_ui_a_core_above_two(monkeypatch, cores, threads):
    import gpu.backends.cpu_threads as cpu_threads

    monkeypatch.delenv("OPENBLAS_NUM_THREADS", raising=False)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(cpu_threads, "usable_cpus", lambda: cores)
    assert app_cpu_threads() == threads
