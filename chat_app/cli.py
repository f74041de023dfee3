"""The `tinychat` command.

    tinychat                      the chat app (the default model is fetched on first run)
    tinychat generate "message"   one reply, streamed to stdout (or one JSON object)
    tinychat pull [MODEL | x.gguf] fetch and convert the default model, or convert a GGUF
    tinychat history              past chats (reopen one with `tinychat --resume ID`)
    tinychat bench                the benchmark (see BENCHMARKS.md)
    tinychat serve                an OpenAI-compatible HTTP server on the engine
    tinychat --connect URL        the app, as a client of any OpenAI-compatible server

Bad input (a missing or broken model, a prompt longer than the context, a bad option value, a
chat id that is not in the history) ends with a one-line `tinychat: error: ...` and exit status
1, never a traceback; a command line argparse cannot read (an unknown option, a missing value)
keeps argparse's usage message and status 2.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable

EXIT_ERROR = 1
EXIT_INTERRUPTED = 130
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE: what a shell reports for a tool whose reader left


class ArgumentParser(argparse.ArgumentParser):
    """argparse, with an option value it cannot take (`--device tpu`, `--top-k x`) reported as
    every other bad value is: one `tinychat: error:` line and status 1.

    argparse reports every error through `error()` with status 2; the values are converted and
    checked in `_get_values` alone, so a failure there is marked and `error()` tells the two
    apart. The sub-commands' parsers are of this class too (argparse builds them from it).
    """

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._bad_value = False

    def _get_values(self, action: argparse.Action, arg_strings):
        try:
            return super()._get_values(action, arg_strings)
        except argparse.ArgumentError:
            # A sub-command name argparse does not know is a usage error, not a value.
            self._bad_value = not isinstance(action, argparse._SubParsersAction)
            raise

    def error(self, message: str):
        if self._bad_value:
            self.exit(EXIT_ERROR, f"tinychat: error: {message}\n")
        super().error(message)


def _add_model_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model",
        default=None,
        help="a model folder, a Hugging Face repo id in the local HF cache, or a .gguf file "
        "(default: SmolLM2-135M-Instruct, fetched on first use)",
    )
    parser.add_argument(
        "--device",
        choices=("auto", "cpu", "cuda"),
        default="auto",
        help="where the model runs (auto: cuda if an NVIDIA GPU is present)",
    )
    parser.add_argument("--max-model-len", type=int, default=None, help="context length cap")
    parser.add_argument(
        "--precision",
        choices=("float32", "q8", "q4"),
        default=None,
        help="cpu: the weights' form: float32 (the numpy reference), q8 or q4 (block-quantized, "
        "Numba kernels; default q8); cuda: bf16 whatever this says",
    )
    parser.add_argument(
        "--no-engine-process",
        action="store_true",
        help="run the engine in a thread of this process instead of an engine-core process of "
        "its own (its step loop then shares this interpreter's GIL)",
    )


def _add_batch_invariant_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--batch-invariant",
        action="store_true",
        help="cuda: the same tokens from the same seed whatever else is running (slower ops; "
        "the cpu is batch-invariant always)",
    )


def _add_sampling_arguments(parser: argparse.ArgumentParser, max_tokens: int | None) -> None:
    parser.add_argument("--max-tokens", type=int, default=max_tokens, help="new tokens at most")
    parser.add_argument("--temperature", type=float, default=None, help="0 is greedy")
    parser.add_argument("--top-p", type=float, default=None)
    parser.add_argument("--top-k", type=int, default=None)
    parser.add_argument("--min-p", type=float, default=None)
    parser.add_argument("--repetition-penalty", type=float, default=None)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--system", default=None, help="a system prompt")


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(prog="tinychat", description="Chat with a local LLM in your terminal.")
    _add_model_arguments(parser)
    try:
        from chat_app.launch import add_app_arguments
    except ImportError:  # the app is optional for the other subcommands
        add_app_arguments = None
    if add_app_arguments is not None:
        add_app_arguments(parser)
    remote = parser.add_argument_group("a remote model (any OpenAI-compatible server)")
    remote.add_argument(
        "--connect",
        metavar="URL",
        default=None,
        help="chat with the model of the server at URL (e.g. http://127.0.0.1:8000/v1) "
        "instead of loading one; --model names the server's model (default: its first)",
    )
    remote.add_argument("--api-key", default=None, help="the server's API key (Bearer)")
    sub = parser.add_subparsers(dest="command")

    gen = sub.add_parser("generate", help="generate one reply and print it")
    gen.add_argument("message", help="the user message (or the raw prompt with --raw)")
    _add_model_arguments(gen)
    _add_batch_invariant_argument(gen)
    _add_sampling_arguments(gen, max_tokens=256)
    gen.add_argument("--raw", action="store_true", help="plain completion, no chat template")
    gen.add_argument("--json", action="store_true", help="print one JSON object at the end")
    gen.add_argument("--ignore-eos", action="store_true", help="do not stop at end-of-sequence")

    pull = sub.add_parser("pull", help="fetch the default model or convert a GGUF file")
    pull.add_argument("model", nargs="?", default=None, help="a .gguf file (default: SmolLM2)")

    history = sub.add_parser("history", help="list past chats")
    from chat_app.history import add_history_arguments

    add_history_arguments(history)

    serve = sub.add_parser("serve", help="an OpenAI-compatible HTTP server on the engine")
    _add_model_arguments(serve)
    _add_batch_invariant_argument(serve)
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--api-key", default=None, help="require `Authorization: Bearer KEY`")

    bench = sub.add_parser("bench", help="measure tokens per second (see BENCHMARKS.md)")
    try:
        from gpu.bench import add_bench_arguments
    except ImportError:
        add_bench_arguments = None
    if add_bench_arguments is not None:
        add_bench_arguments(bench)
        from chat_app.bench_app import add_bench_app_arguments

        add_bench_app_arguments(bench)  # `tinychat bench app`: the app's cost to the engine
    return parser


class ProgressPrinter:
    """Progress of a download, a conversion or the engine's build (loading weights, compiling
    kernels) as one rewritten line on stderr, with a bar where the total is known.

    A new line starts only when the kind of work changes (its first word: "downloading",
    "converting", "compiling", ...), so compiling 60 kernels is one line whose bar fills.
    """

    BAR_WIDTH = 24

    def __init__(self) -> None:
        self._kind = self._stage = ""
        self._width = 0
        self._last_time = 0.0

    def __call__(self, stage: str, done: int, total: int) -> None:
        now = time.monotonic()
        final = bool(total) and done >= total
        kind = stage.split(" ", 1)[0]
        if stage == self._stage and now - self._last_time < 0.1 and not final:
            return  # at most 10 redraws a second of one stage's count
        self._last_time, self._stage = now, stage
        if kind != self._kind and self._kind:
            sys.stderr.write("\n")
            self._width = 0
        self._kind = kind
        line = f"{stage}..."
        if total:
            line = f"{stage} {self.bar(done, total)} {done}/{total} ({100 * done // total}%)"
        sys.stderr.write("\r" + line.ljust(self._width))
        self._width = len(line)
        sys.stderr.flush()

    @classmethod
    def bar(cls, done: int, total: int) -> str:
        filled = cls.BAR_WIDTH * min(done, total) // total
        return "[" + "#" * filled + "-" * (cls.BAR_WIDTH - filled) + "]"

    def finish(self) -> None:
        if self._kind:
            sys.stderr.write("\n")
            sys.stderr.flush()
            self._kind = ""


def sampling_params_from_args(args: argparse.Namespace, generation_config=None):
    """SamplingParams from the command line, with the model's generation_config defaults."""
    from gpu import SamplingParams

    def pick(name: str, default):
        value = getattr(args, name, None)
        if value is not None:
            return value
        if generation_config is not None and getattr(generation_config, name, None) is not None:
            return getattr(generation_config, name)
        return default

    return SamplingParams(
        temperature=pick("temperature", 0.0),
        top_p=pick("top_p", 1.0),
        top_k=pick("top_k", 0),
        min_p=pick("min_p", 0.0),
        repetition_penalty=pick("repetition_penalty", 1.0),
        seed=getattr(args, "seed", None),
        max_tokens=getattr(args, "max_tokens", None),
        ignore_eos=getattr(args, "ignore_eos", False),
    )


def _generate_client(args: argparse.Namespace, progress: ProgressPrinter):
    """The engine behind `tinychat generate`: an engine-core process (the default), or an
    engine thread here with --no-engine-process; either way EngineThread's calls."""
    from gpu import EngineConfig

    config = EngineConfig(
        max_model_len=args.max_model_len,
        max_num_seqs=8,
        precision=getattr(args, "precision", None),
        batch_invariant=getattr(args, "batch_invariant", False),
    )
    if getattr(args, "no_engine_process", False):
        from gpu.engine_thread import EngineThread
        from gpu.loader import create_engine

        return EngineThread(create_engine(args.model, args.device, config, progress=progress))
    from gpu.engine_core import EngineCoreClient

    return EngineCoreClient(args.model, args.device, config, progress=progress)


def cmd_generate(args: argparse.Namespace) -> int:
    progress = ProgressPrinter()
    params = sampling_params_from_args(args)  # validate options before loading anything
    client = _generate_client(args, progress)
    progress.finish()
    client.start()
    try:
        return _generate(args, client, params)
    finally:
        client.shutdown()


def _generate(args: argparse.Namespace, client, params) -> int:
    engine = client.engine
    tok = engine.tokenizer
    if args.raw:
        prompt_ids = tok.encode(args.message, add_special_tokens=True)
    else:
        messages = []
        if args.system:
            messages.append({"role": "system", "content": args.system})
        messages.append({"role": "user", "content": args.message})
        prompt_ids = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    stream = client.submit(prompt_ids, params)
    text_parts: list[str] = []
    output_ids: list[int] = []
    finish_reason = None
    first = last = None
    try:
        for out in stream:
            delta = out.outputs[0]
            now = time.monotonic()
            if delta.token_ids:
                first = first or now
                last = now
            output_ids += delta.token_ids
            text_parts.append(delta.text)
            if not args.json and delta.text:
                sys.stdout.write(delta.text)
                sys.stdout.flush()
            if out.finished:
                finish_reason = delta.finish_reason
                if out.error:
                    raise RuntimeError(out.error)
    except KeyboardInterrupt:
        client.abort(stream.request_id)
        raise
    tokens_per_s = (len(output_ids) - 1) / (last - first) if last and last > first else 0.0
    if args.json:
        print(
            json.dumps(
                {
                    "model": engine.model_name,
                    "prompt_ids": prompt_ids,
                    "output_ids": output_ids,
                    "text": "".join(text_parts),
                    "finish_reason": finish_reason,
                    "tokens_per_s": round(tokens_per_s, 2),
                },
                ensure_ascii=False,
            )
        )
    else:
        sys.stdout.write("\n")
        sys.stderr.write(
            f"[{len(output_ids)} tokens, {tokens_per_s:.1f} tok/s, finish: {finish_reason}]\n"
        )
    return 0


def cmd_pull(args: argparse.Namespace) -> int:
    """Fetch and convert; the default model is also checked, and converted again if broken."""
    from weights import DEFAULT_MODEL_NAME, pull_default_model, resolve_model

    progress = ProgressPrinter()
    if args.model is None or args.model == DEFAULT_MODEL_NAME:
        folder = pull_default_model(progress, verify=True)
    else:
        folder = resolve_model(args.model, progress)
    progress.finish()
    print(folder)
    return 0


def cmd_history(args: argparse.Namespace) -> int:
    from chat_app.history import print_history

    return print_history(args)


def cmd_bench(args: argparse.Namespace) -> int:
    from gpu.bench import run_bench

    args.progress = ProgressPrinter()  # the engine build's bar (kernels compiling, ...)
    if "app" in args.workloads:  # the real app against the engine alone (chat_app/bench_app.py)
        from chat_app.bench_app import run_bench_app

        return run_bench_app(args)
    return run_bench(args)


def cmd_serve(args: argparse.Namespace) -> int:
    try:
        from gpu.entrypoints.openai.api_server import run_server
    except ImportError as error:
        missing = (error.name or "a package").split(".")[0]
        raise RuntimeError(
            f"tinychat serve needs the server's packages ({missing} is missing): "
            "pip install 'tinychat[serve]'"
        ) from None
    return run_server(args, ProgressPrinter())


def _check_resume(chat_id: int) -> None:
    """Refuse `--resume ID` for a chat the history does not hold, before anything loads."""
    from chat_app.history import HistoryStore

    store = HistoryStore.open()
    try:
        if store.notice:
            print(f"tinychat: {store.notice}", file=sys.stderr)
        found = store.load_session(chat_id) is not None
    finally:
        store.close()
    if not found:
        raise ValueError(f"no chat {chat_id} in the history (`tinychat history` lists them)")


def cmd_app(args: argparse.Namespace) -> int:
    from chat_app.launch import run_app, settings_from_args

    settings_from_args(args)  # bad sampling options fail here, before the model is fetched
    if getattr(args, "resume", None) is not None:
        _check_resume(args.resume)
    if args.connect is None and (args.model is None or args.model.endswith(".gguf")):
        from weights import resolve_model

        progress = ProgressPrinter()  # fetch before the UI opens, so progress is visible
        args.model = str(resolve_model(args.model, progress))
        progress.finish()
    return run_app(args)


COMMANDS: dict[str | None, Callable[[argparse.Namespace], int]] = {
    "generate": cmd_generate,
    "pull": cmd_pull,
    "history": cmd_history,
    "bench": cmd_bench,
    "serve": cmd_serve,
    None: cmd_app,
}


def _known_errors() -> tuple[type[BaseException], ...]:
    errors: list[type[BaseException]] = [ValueError, RuntimeError, OSError]
    try:
        from weights import ModelLoadError

        errors.insert(0, ModelLoadError)
    except ImportError:
        pass
    from chat_app.history import HistoryError  # a locked or unreadable history, left as it is

    errors.insert(0, HistoryError)
    return tuple(errors)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return COMMANDS[args.command](args)
    except KeyboardInterrupt:
        sys.stderr.write("\ntinychat: interrupted\n")
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # The reader of stdout left (`tinychat history | head -1`): stop quietly, as a tool
        # killed by SIGPIPE does, and point stdout at /dev/null so the exit's flush is quiet too.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_BROKEN_PIPE
    except _known_errors() as exc:
        sys.stderr.write(f"tinychat: error: {exc}\n")
        return EXIT_ERROR


if __name__ == "__main__":
    sys.exit(main())
