"""The OpenAI-compatible HTTP server: a Starlette app on uvicorn, in front of the engine client.

Starlette rather than FastAPI: the server has five routes and answers every error in OpenAI's
shape itself (FastAPI's request validation answers 422 in a shape of its own, to be undone by
hand); the request bodies are pydantic models all the same (protocol.py). uvicorn is the ASGI
server vLLM uses; with uvicorn's Starlette-era spec a streaming response listens for the
client's disconnect beside the stream and cancels it at once, which aborts the request in the
engine (async_engine.py); a whole (non-streaming) reply watches for the disconnect itself.

    tinychat serve [--model M] [--device D] [--host 127.0.0.1] [--port 8000] [--api-key K]

With an API key, every /v1 route needs `Authorization: Bearer K` (401 otherwise); /health and
/metrics stay open, as in vLLM.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import hmac
import logging
import socket
import threading
import time
from collections.abc import AsyncIterator, Coroutine, Iterator
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from gpu.entrypoints.openai.async_engine import AsyncEngine
from gpu.entrypoints.openai.metrics import CONTENT_TYPE, ServerMetrics
from gpu.entrypoints.openai.protocol import ChatCompletionRequest, CompletionRequest, OpenAIError
from gpu.entrypoints.openai.serving_chat import OpenAIServingChat
from gpu.entrypoints.openai.serving_completion import OpenAIServingCompletion
from gpu.entrypoints.openai.sse_response import EventStreamResponse

log = logging.getLogger(__name__)
GRACEFUL_SHUTDOWN_S = 5


def error_response(error: OpenAIError) -> JSONResponse:
    return JSONResponse(error.body(), status_code=error.status)


class ApiKeyMiddleware:
    """401 for a /v1 request without `Authorization: Bearer <key>` (compared in constant
    time)."""

    def __init__(self, app: ASGIApp, api_key: str) -> None:
        self.app = app
        self._expected = f"Bearer {api_key}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"].startswith("/v1"):
            given = dict(scope["headers"]).get(b"authorization", b"")
            if not hmac.compare_digest(given, self._expected):
                error = OpenAIError(
                    "Incorrect or missing API key: send `Authorization: Bearer <key>`.",
                    401,
                    code="invalid_api_key",
                )
                await error_response(error)(scope, receive, send)
                return
        await self.app(scope, receive, send)


YOUNG_GC_THRESHOLD = 10_000
_gc_saved: list[tuple[int, int, int]] = []  # the thresholds before the first running server
_was_frozen = [False]  # the heap was frozen already when the first server started


@contextlib.contextmanager
def frozen_heap() -> Iterator[None]:
    """While a server runs: the heap that exists at its start frozen (no collection walks it
    again), and a young collection every YOUNG_GC_THRESHOLD new objects instead of 700, as
    vLLM's front end does. 64 streams make garbage fast: with Python's defaults a run of
    `serve_synthetic --core` (64 x 512 tokens) made ~110 young, ~10 middle and one full
    collection of the ~60,000-object heap, 75-97 ms of the server process's time, the full one
    alone a 35-77 ms pause; frozen, 2-6 young ones, 13-22 ms. When the last server of the
    process stops, the heap is unfrozen and the thresholds restored (a process that starts
    servers and goes on, as the tests do, keeps nothing frozen), unless something else had
    frozen it before (the app's own tuning, chat_app/gc_tuning.py: it stays frozen).
    `run_server` collects the start-up's garbage first; here it would cost every server start
    a full collection."""
    if not _gc_saved:
        _was_frozen[0] = gc.get_freeze_count() > 0
        _gc_saved.append(gc.get_threshold())
        young, middle, oldest = _gc_saved[0]
        gc.set_threshold(max(YOUNG_GC_THRESHOLD, young), middle, oldest)
        gc.freeze()
    else:
        _gc_saved.append(_gc_saved[0])
    try:
        yield
    finally:
        saved = _gc_saved.pop()
        if not _gc_saved:
            if not _was_frozen[0]:
                gc.unfreeze()
            gc.set_threshold(*saved)


def build_app(client: Any, api_key: str | None = None) -> Starlette:
    """The ASGI app over a started engine client (chat_app/engine_api.py's contract)."""
    model_name = client.engine.model_name or "tinychat"
    metrics = ServerMetrics(model_name, client.stats)
    state: dict[str, Any] = {}

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        engine = AsyncEngine(client)  # on the server's event loop
        state["chat"] = OpenAIServingChat(engine, model_name, metrics)
        state["completion"] = OpenAIServingCompletion(engine, model_name, metrics)
        state["engine"] = engine
        with frozen_heap():
            yield

    async def health(request: Request) -> Response:
        alive = getattr(client, "is_alive", True)
        return Response(status_code=200 if alive else 503)

    async def models(request: Request) -> JSONResponse:
        card = {
            "id": model_name,
            "object": "model",
            "created": int(time.time()),
            "owned_by": "tinychat",
            "max_model_len": client.engine.max_model_len,
        }
        return JSONResponse({"object": "list", "data": [card]})

    async def prometheus(request: Request) -> Response:
        return Response(metrics.render(), media_type=CONTENT_TYPE)

    def endpoint(serving_key: str, request_type: type):
        async def handle(request: Request) -> Response:
            body = request_type.parse(await request.body())
            serving = state[serving_key]
            if body.stream:
                return EventStreamResponse(await serving.stream(body))
            return JSONResponse(await _unless_disconnected(request, serving.create(body)))

        return handle

    async def openai_error(request: Request, error: Exception) -> Response:
        assert isinstance(error, OpenAIError)
        return error_response(error)

    async def http_error(request: Request, error: Exception) -> Response:
        assert isinstance(error, HTTPException)
        message = f"{request.method} {request.url.path}: {error.detail}"
        return error_response(OpenAIError(message, error.status_code))

    async def server_error(request: Request, error: Exception) -> Response:
        log.exception("request failed", exc_info=error)
        return error_response(OpenAIError(f"Internal server error: {error}", 500))

    routes = [
        Route("/health", health, methods=["GET"]),
        Route("/metrics", prometheus, methods=["GET"]),
        Route("/v1/models", models, methods=["GET"]),
        Route(
            "/v1/chat/completions",
            endpoint("chat", ChatCompletionRequest),
            methods=["POST"],
        ),
        Route("/v1/completions", endpoint("completion", CompletionRequest), methods=["POST"]),
    ]
    app = Starlette(
        routes=routes,
        lifespan=lifespan,
        exception_handlers={
            OpenAIError: openai_error,
            HTTPException: http_error,
            Exception: server_error,
        },
    )
    if api_key:
        app.add_middleware(ApiKeyMiddleware, api_key=api_key)
    app.state.serving = state
    return app


async def _unless_disconnected(request: Request, reply: Coroutine[Any, Any, Any]) -> Any:
    """A whole (non-streaming) reply, abandoned the moment its client disconnects (vLLM's
    with_cancellation): cancelling it leaves the engine stream, which aborts the request."""
    task = asyncio.ensure_future(reply)

    async def disconnected() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    watcher = asyncio.ensure_future(disconnected())
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
    if not task.done():
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        raise OpenAIError("The client disconnected.", 499)
    return task.result()


def uvicorn_config(
    app: ASGIApp, host: str, port: int, access_log: bool = True, log_level: str = "info"
) -> uvicorn.Config:
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        access_log=access_log,
        log_level=log_level,
        timeout_keep_alive=30,
        # Ctrl+C with replies still streaming: they get this long to finish, then are cut
        # (and the engine client's shutdown aborts them) instead of holding the exit.
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
    )


def listening_socket(host: str, port: int) -> socket.socket:
    """The server's socket, bound (port 0: one the OS picks). `tinychat serve` binds it before
    the model loads, so a port in use fails at once, not after a load of seconds to a minute.

    IPPROTO_TCP named, not left 0: asyncio turns Nagle's algorithm off (TCP_NODELAY) only on
    sockets that say they are TCP, and with it on, each token's small write waited for the
    client's delayed ACK (40 ms)."""
    try:
        family, _, _, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
    except socket.gaierror as error:
        raise OSError(f"cannot listen on {host}: {error.strerror} (--host)") from None
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
    except OSError as error:
        sock.close()
        hint = " (another server there? choose a port with --port)" if port else ""
        raise OSError(f"cannot listen on {host}:{port}: {error.strerror}{hint}") from None
    return sock


class ServerThread:
    """The server in a background thread of this process, on a port the OS picks (the tests,
    `tinychat bench serve`). `url` is its base, e.g. http://127.0.0.1:41234/v1."""

    def __init__(self, app: Starlette, host: str = "127.0.0.1") -> None:
        self._socket = listening_socket(host, 0)
        port = self._socket.getsockname()[1]
        config = uvicorn_config(app, host, port, access_log=False, log_level="warning")
        self.server = _Server(config, app)
        self.url = f"http://{host}:{port}/v1"
        self._thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [self._socket]}, daemon=True
        )

    def start(self, timeout: float = 30.0) -> ServerThread:
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the server did not start")
            time.sleep(0.01)
        return self

    def stop(self, timeout: float = 10.0) -> None:
        self.server.should_exit = True
        self._thread.join(timeout)
        self._socket.close()


class _Server(uvicorn.Server):
    """uvicorn, ending the open streams first when it stops (Ctrl+C): each gets an error
    event and [DONE] at once, rather than being cut when the graceful wait runs out."""

    def __init__(self, config: uvicorn.Config, app: Starlette) -> None:
        super().__init__(config)
        self._app = app

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        engine = getattr(self._app.state, "serving", {}).get("engine")
        if engine is not None:
            engine.abort_all()
        await super().shutdown(sockets)
        if self.force_exit:
            # A second Ctrl+C makes uvicorn skip the app's shutdown; its lifespan task would
            # then be cancelled at exit and logged as a traceback. The streams are ended
            # already, so the shutdown is quick: run it.
            await self.lifespan.shutdown()


def server_engine_config(args: Any) -> Any:
    """The EngineConfig of `tinychat serve`'s command line."""
    from gpu.config import EngineConfig

    return EngineConfig(
        max_model_len=getattr(args, "max_model_len", None),
        precision=getattr(args, "precision", None),
        batch_invariant=getattr(args, "batch_invariant", False),
        capture_graphs_at_start=True,  # a server starts once: no capture inside a reply
    )


def run_server(args: Any, progress: Any = None) -> int:
    """`tinychat serve`: bind the port, load the model, then serve until Ctrl+C."""
    sock = listening_socket(args.host, args.port)  # a port in use fails before the load
    try:
        return _load_and_serve(args, sock, progress)
    finally:
        sock.close()


def _load_and_serve(args: Any, sock: socket.socket, progress: Any) -> int:
    from gpu.entrypoints.openai.async_engine import build_engine_client

    config = server_engine_config(args)
    engine_process = not getattr(args, "no_engine_process", False)
    client = build_engine_client(
        args.model, args.device, config, progress=progress, engine_process=engine_process
    )
    if progress is not None and hasattr(progress, "finish"):
        progress.finish()
    client.start()
    gc.collect()  # the load's garbage, before the server freezes the heap (frozen_heap)
    try:
        app = build_app(client, api_key=args.api_key)
        engine = client.engine
        print(
            f"tinychat serve: {engine.model_name} on {engine.device}, context "
            f"{engine.max_model_len:,} tokens, at http://{args.host}:{args.port}/v1"
            + (" (API key required)" if args.api_key else ""),
            flush=True,
        )
        _Server(uvicorn_config(app, args.host, args.port), app).run(sockets=[sock])
    finally:
        client.shutdown()
    return 0
