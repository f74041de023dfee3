"""`tinychat` (the app): its command-line options, and running it.

The CLI (chat_app/cli.py) adds --model and --device, resolves or pulls the default model, then
calls `add_app_arguments` and `run_app` from here.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import fields
from pathlib import Path

from chat_app.engine_api import EngineFactory, EngineThread
from chat_app.session import ChatSettings

_DEFAULTS = ChatSettings()
ENGINE_LOG = "engine-core.log"  # in the home: the engine core's stdout and stderr


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


def app_cpu_threads() -> int:
    """Threads of the app's engine on the cpu (`bench app` runs the app's engine with the same
    count): every usable core but one for the UI where there are more than two; on two, both.
    A q8 decode step is one parallel region whose shares meet at barriers, so a share the UI
    preempts holds up the step; but on two cores a one-thread engine loses more: the app at 2
    tabs x 512 tokens streamed 85.4 / 98.4 tok/s on a two-thread engine against 83.1 / 75.7 on
    one (2-core host, alternating)."""
    from gpu.backends.cpu_threads import resolve_threads, usable_cpus

    return resolve_threads(None, reserve=1 if usable_cpus() > 2 else 0)


def engine_factory(
    model: str | None,
    device: str,
    max_model_len: int | None = None,
    progress: Callable[[str, int, int], None] | None = None,
    *,
    engine_process: bool = True,
    log_path: str | None = None,
    precision: str | None = None,
) -> EngineThread:
    """Load the model behind an engine client (slow: runs in the app's worker).
    progress(stage, done, total) hears how far the build is (weights, kernels compiling).

    engine_process: the engine core runs in a process of its own (gpu.engine_core), so the
    UI's Python never holds the GIL its step loop needs; False: an engine thread in this
    process, as `tinychat --no-engine-process` asks (`tinychat bench app` compares the two).
    log_path: where the core's own output goes (the app owns the terminal)."""
    from gpu import EngineConfig  # imported here: the UI opens before the engine's imports finish

    options = {} if max_model_len is None else {"max_model_len": max_model_len}
    options.update(precision=precision, cpu_threads=app_cpu_threads())
    if engine_process:
        from gpu.engine_core import EngineCoreClient

        config = EngineConfig(**options)
        return EngineCoreClient(model, device, config, progress=progress, log_path=log_path)
    from gpu import LLM
    from gpu.engine_thread import EngineThread as RealEngineThread

    llm = LLM(model=model, device=device, progress=progress, **options)
    return RealEngineThread(llm.llm_engine)


def _remote_factory(args: argparse.Namespace, model: str | None) -> EngineFactory | None:
    """`tinychat --connect URL`: the replies come from that server (chat_app/remote_engine.py)
    and nothing loads here; --model names the server's model."""
    url = getattr(args, "connect", None)
    if not url:
        return None
    from chat_app.remote_engine import connect

    return lambda: connect(url, getattr(args, "api_key", None), model)


def _engine_log(home: Path) -> str:
    """A fresh log file for the engine core's output; the null device where the home is
    read-only (the app runs there too, without saving)."""
    import os

    path = home / ENGINE_LOG
    try:
        path.write_bytes(b"")
    except OSError:
        return os.devnull
    return str(path)


def run_app(args: argparse.Namespace) -> int:
    """Run the app until the user quits; returns the process exit status."""
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
        return 1  # a bad option value, as the CLI's own check and the README have it
    keymap_file = getattr(args, "keymap", None)
    keymap, keymap_error = load_keymap(
        Path(keymap_file) if keymap_file else None, TinyChatApp.binding_ids()
    )
    model, device = getattr(args, "model", None), getattr(args, "device", "auto") or "auto"
    max_model_len = getattr(args, "max_model_len", None)
    engine_process = not getattr(args, "no_engine_process", False)
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
    log_path = _engine_log(history_path().parent)
    remote = _remote_factory(args, model)
    app = TinyChatApp(
        # The loading line shows the build's progress (the factory runs once the app exists).
        remote
        or (
            lambda: engine_factory(
                model,
                device,
                max_model_len,
                app.client.report_progress,
                engine_process=engine_process,
                log_path=log_path,
                precision=getattr(args, "precision", None),
            )
        ),
        store,
        defaults=defaults,
        fresh=args.fresh,
        resume=args.resume,
        yield_to_cpu_engine=True,
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
    # After a crash Textual's run() returns None and return_code is 1.
    return app.return_code or (status if isinstance(status, int) else 0)
