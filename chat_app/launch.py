"""`tinychat` (the app): its command-line options, and running it.

The CLI (chat_app/cli.py) adds --model and --device, resolves or pulls the default model, then
calls `add_app_arguments` and `run_app` from here.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import fields

from chat_app.engine_api import EngineThread
from chat_app.session import ChatSettings

_DEFAULTS = ChatSettings()


def add_app_arguments(parser: argparse.ArgumentParser) -> None:
    """The app's options: default settings for new chats, and which chats to open."""
    group = parser.add_argument_group(
        "chat settings (defaults for new tabs; Ctrl+S changes a tab's)"
    )
    group.add_argument(
        "--system", default=_DEFAULTS.system_prompt, metavar="TEXT", help="system prompt"
    )
    group.add_argument(
        "--temperature",
        type=float,
        default=_DEFAULTS.temperature,
        help="sampling temperature; 0 is greedy (default: %(default)s)",
    )
    group.add_argument(
        "--top-p",
        type=float,
        default=_DEFAULTS.top_p,
        help="nucleus sampling threshold (default: %(default)s)",
    )
    group.add_argument(
        "--top-k",
        type=int,
        default=_DEFAULTS.top_k,
        help="keep the k likeliest tokens; 0 is off (default: %(default)s)",
    )
    group.add_argument(
        "--min-p",
        type=float,
        default=_DEFAULTS.min_p,
        help="drop tokens below min-p times the top probability (default: %(default)s)",
    )
    group.add_argument(
        "--max-tokens",
        type=int,
        default=_DEFAULTS.max_tokens,
        help="longest reply in tokens (default: %(default)s)",
    )
    group.add_argument("--seed", type=int, default=_DEFAULTS.seed, help="make replies reproducible")
    group.add_argument(
        "--repetition-penalty",
        type=float,
        default=_DEFAULTS.repetition_penalty,
        help="penalise repeated tokens; 1 is off (default: %(default)s)",
    )
    tabs = parser.add_argument_group("chats")
    tabs.add_argument(
        "--fresh",
        action="store_true",
        help="start with one empty tab instead of the tabs open last time",
    )
    tabs.add_argument(
        "--resume", type=int, metavar="ID", help="reopen chat ID (see `tinychat history`)"
    )
    tabs.add_argument(
        "--keymap",
        metavar="FILE",
        help="JSON file of binding id -> keys (default: keymap.json in the home)",
    )


def settings_from_args(args: argparse.Namespace) -> ChatSettings:
    """The default ChatSettings the options describe; ValueError if the engine would refuse."""
    names = {"system_prompt": "system"}
    values = {
        f.name: getattr(args, names.get(f.name, f.name), getattr(_DEFAULTS, f.name))
        for f in fields(ChatSettings)
    }
    settings = ChatSettings(**values)
    settings.sampling_params()
    return settings


def engine_factory(
    model: str | None,
    device: str,
    max_model_len: int | None = None,
    progress: Callable[[str, int, int], None] | None = None,
) -> EngineThread:
    """Load the model and wrap it in an engine thread (slow: runs in the app's worker).
    progress(stage, done, total) hears how far the build is (weights, kernels compiling)."""
    from gpu import LLM  # imported here: the UI opens before the engine's imports finish
    from gpu.engine_thread import EngineThread as RealEngineThread

    options = {} if max_model_len is None else {"max_model_len": max_model_len}
    llm = LLM(model=model, device=device, progress=progress, **options)
    return RealEngineThread(llm.llm_engine)


def run_app(args: argparse.Namespace) -> int:
    """Run the app until the user quits; returns the process exit status."""
    from pathlib import Path

    from chat_app.app import TinyChatApp
    from chat_app.history import HistoryError, HistoryStore
    from chat_app.instance_lock import AlreadyRunning, InstanceLock
    from chat_app.keymap import load_keymap
    from chat_app.paths import history_path
    from chat_app.terminal_keys import read_escape_digit_as_alt

    try:
        defaults = settings_from_args(args)
    except ValueError as error:
        print(f"tinychat: error: {error}", file=sys.stderr)
        return 2
    keymap_file = getattr(args, "keymap", None)
    keymap, keymap_error = load_keymap(Path(keymap_file) if keymap_file else None)
    model, device = getattr(args, "model", None), getattr(args, "device", "auto") or "auto"
    max_model_len = getattr(args, "max_model_len", None)
    try:
        lock = InstanceLock.acquire(history_path().parent)
    except AlreadyRunning as error:
        print(f"tinychat: error: {error}", file=sys.stderr)
        return 1
    try:
        store = HistoryStore.open()
    except HistoryError as error:
        lock.release()
        print(f"tinychat: error: {error}", file=sys.stderr)
        return 1
    app = TinyChatApp(
        # The loading line shows the build's progress (the factory runs once the app exists).
        lambda: engine_factory(model, device, max_model_len, app.client.report_progress),
        store,
        defaults=defaults,
        fresh=args.fresh,
        resume=args.resume,
        keymap=keymap,
        notices=[keymap_error] if keymap_error else [],
    )
    read_escape_digit_as_alt()
    try:
        status = app.run()
    finally:
        app.client.shutdown()  # also when the app crashed: never leave the engine running
        store.close()
        lock.release()
    return status if isinstance(status, int) else 0
