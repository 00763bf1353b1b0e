"""`specrt serve`: an OpenAI-compatible HTTP server over the batch engine (needs the `[serve]` extra).

A thin layer: it checks requests (protocol.py), turns them into generations of one shared Engine, streams
their text, and counts what happened (metrics.py). The Engine's scheduler thread does all model work; the
event loop only waits on it from worker threads, so it never blocks on ONNX Runtime. Admission control:
at most `max_batch` requests run and `max_queue` wait; more get 429. A client that disconnects cancels its
generation (its slot is free before the next round). On SIGINT/SIGTERM the server stops admitting (503),
lets running requests finish for `drain_s` seconds, then cancels the rest.
"""

from __future__ import annotations

import contextlib
import hmac
import json
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import anyio
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from ..errors import PromptError, SpecrtError
from .metrics import Metrics
from .progress import Progress
from .protocol import Defaults, Parsed, RequestError, chunk, new_id, parse, response, usage, usage_chunk

MAX_BODY = 4 << 20  # bytes of a request body
_DONE = object()


class Flight:
    """One admitted request on the server's side: counted once when it ends, however it ends."""

    def __init__(self, server: Server, gen):
        self.server, self.gen = server, gen
        self.start, self.ttft, self.ended = time.perf_counter(), None, False

    def first_piece(self) -> None:
        self.ttft = self.ttft or time.perf_counter() - self.start

    def end(self, outcome: str) -> None:
        if self.ended:
            return
        self.ended = True
        self.gen.close()  # cancels a generation still running (a no-op once it finished)
        self.server.inflight -= 1
        gen, took = self.gen, time.perf_counter() - self.start
        self.server.metrics.finished(outcome, len(gen.prompt_ids), len(gen.token_ids), self.ttft, took)


@dataclass
class ServeConfig:
    model_name: str
    max_queue: int = 64
    api_key: str | None = None
    defaults: Defaults = Defaults()
    drain_s: float = 30.0


class Server:
    """The app's state: the engine (loaded in the background when a loader is given), counts, metrics."""

    def __init__(self, engine_or_loader, config: ServeConfig):
        self.config = config
        self.engine = None if callable(engine_or_loader) else engine_or_loader
        self.loading_error: str | None = None
        self.draining = False
        self.inflight = 0  # requests admitted and not finished
        self.metrics = Metrics(self._engine_stats)
        self.progress = Progress()
        if self.engine is None:
            threading.Thread(target=self._load, args=(engine_or_loader,), daemon=True).start()

    def _load(self, loader: Callable) -> None:
        try:
            self.engine = loader()
        except Exception as e:  # noqa: BLE001 - reported by /health
            self.loading_error = str(e).splitlines()[0] if str(e) else type(e).__name__

    def _engine_stats(self) -> dict:
        if self.engine is None:
            empty = {"running": 0, "waiting": 0, "rounds": 0, "drafts": 0, "draft_tokens": 0, "accepted_tokens": 0}
            return empty | {"accepted_per_position": {}, "k_chosen": {}, "batch_sizes": {}}
        return self.engine.stats

    # ------------------------------------------------------------------ routes

    async def health(self, request: Request) -> Response:
        if self.engine is None:
            state = f"failed to load: {self.loading_error}" if self.loading_error else "loading"
            return _error(RequestError(f"the model is {state}", status=503, code="unavailable"))
        if self.draining:
            return _error(RequestError("the server is shutting down", status=503, code="unavailable"))
        s = self.engine.stats
        stalled = self.progress.stalled_for(s.get("progress", s["rounds"]), bool(s["running"] or s["waiting"]))
        if stalled is not None:
            message = f"the scheduler has made no progress for {stalled:.0f} s with work queued"
            return _error(RequestError(message, status=503, code="unavailable"))
        body = {"status": "ok", "running": s["running"], "waiting": s["waiting"], "rounds": s["rounds"]}
        return JSONResponse(body)

    async def models(self, request: Request) -> Response:
        self._authorize(request)
        model = {"id": self.config.model_name, "object": "model", "created": 0, "owned_by": "specrt"}
        return JSONResponse({"object": "list", "data": [model]})

    async def prometheus(self, request: Request) -> Response:
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        return Response(generate_latest(self.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    async def completions(self, request: Request) -> Response:
        return await self._generate(request, "completion")

    async def chat(self, request: Request) -> Response:
        return await self._generate(request, "chat")

    # ------------------------------------------------------------------ generation

    async def _generate(self, request: Request, kind: str) -> Response:
        self._authorize(request)
        if self.draining:
            raise RequestError("the server is shutting down", status=503, code="unavailable")
        if self.engine is None:
            raise RequestError("the model is still loading; retry shortly", status=503, code="unavailable")
        body = await _read_json(request)
        p = parse(body, kind, self.config.defaults, (self.config.model_name,))
        if self.inflight >= self.engine.max_batch + self.config.max_queue:
            self.metrics.requests.labels("rejected_429").inc()
            raise RequestError(
                f"the queue is full ({self.engine.max_batch} running, {self.config.max_queue} waiting); retry later",
                status=429,
                code="queue_full",
            )
        self.inflight += 1
        try:
            gen = await anyio.to_thread.run_sync(self._start, p)
        except BaseException:
            self.inflight -= 1
            raise
        flight, rid = Flight(self, gen), new_id(kind)
        if p.stream:
            return StreamingResponse(self._events(flight, p, rid), media_type="text/event-stream")
        return await self._whole(request, flight, p, rid)

    def _start(self, p: Parsed):
        """The engine's Generation for a checked request (tokenizing may take a moment: not on the loop)."""
        param = "prompt" if p.kind == "completion" else "messages"
        try:
            if p.kind == "completion":
                return self.engine.generate(p.prompt, p.options)
            return self.engine.generate(self.engine.encode_messages(p.messages), p.options)
        except PromptError as e:
            code = "context_length_exceeded" if "max_seq_len" in str(e) else "invalid_prompt"
            raise RequestError(str(e), param, code=code) from None
        except SpecrtError as e:
            raise RequestError(str(e), param) from None

    async def _pieces(self, gen) -> AsyncIterator[str]:
        """The generation's text, each piece waited for in a worker thread (the loop never blocks), or on the
        loop itself for a generation that can be awaited (a remote one: specrt/scale/frontend.py)."""
        if hasattr(gen, "__aiter__"):
            async for piece in gen:
                yield piece
            return
        it = iter(gen)
        while True:
            piece = await anyio.to_thread.run_sync(next, it, _DONE, abandon_on_cancel=True)
            if piece is _DONE:
                return
            yield piece

    async def _whole(self, request: Request, flight: Flight, p: Parsed, rid: str) -> Response:
        """A non-streaming request: collected while watching for the client going away."""
        gen, text = flight.gen, []
        try:
            async with anyio.create_task_group() as tg:

                async def watch() -> None:
                    while (await request.receive())["type"] != "http.disconnect":
                        pass
                    flight.end("cancelled")  # the client went away: free its slot now
                    tg.cancel_scope.cancel()

                tg.start_soon(watch)
                async for piece in self._pieces(gen):
                    flight.first_piece()
                    text.append(piece)
                tg.cancel_scope.cancel()
        except Exception as e:  # noqa: BLE001 - a failed graph run fails this request only
            flight.end("error")
            raise RequestError(f"generation failed: {str(e)[:200]}", status=500, code="server_error") from None
        if flight.ended:  # cancelled: nobody is left to answer
            return Response(status_code=499)
        flight.end(gen.finish_reason or "stop")
        use = usage(len(gen.prompt_ids), len(gen.token_ids), gen.stats.to_dict())
        return JSONResponse(response(p, rid, "".join(text), gen.finish_reason, use))

    async def _events(self, flight: Flight, p: Parsed, rid: str) -> AsyncIterator[str]:
        gen, outcome = flight.gen, "cancelled"
        try:
            first = True
            async for piece in self._pieces(gen):
                flight.first_piece()
                yield _sse(chunk(p, rid, piece, first=first))
                first = False
            yield _sse(chunk(p, rid, None, finish=gen.finish_reason or "stop", first=first))
            if p.include_usage:
                yield _sse(usage_chunk(p, rid, usage(len(gen.prompt_ids), len(gen.token_ids), gen.stats.to_dict())))
            yield "data: [DONE]\n\n"
            outcome = gen.finish_reason or "stop"
        except Exception as e:  # noqa: BLE001 - the stream has started: report in-band, then end it
            outcome = "error"
            yield _sse(RequestError(f"generation failed: {str(e)[:200]}", status=500, code="server_error").body())
            yield "data: [DONE]\n\n"
        finally:  # a client that went away lands here too (its stream is cancelled): free its slot
            flight.end(outcome)

    def _authorize(self, request: Request) -> None:
        key = self.config.api_key
        if key is None:
            return
        given = request.headers.get("authorization", "")
        token = given[7:] if given.lower().startswith("bearer ") else ""
        if not hmac.compare_digest(token.encode(), key.encode()):  # constant time
            raise RequestError("a valid API key is required: Authorization: Bearer <key>", status=401)

    # ------------------------------------------------------------------ shutdown

    async def drain(self) -> None:
        """Stop admitting; give running requests `drain_s` seconds, then cancel what is left."""
        self.draining = True
        deadline = time.monotonic() + self.config.drain_s
        while self.inflight and time.monotonic() < deadline:
            await anyio.sleep(0.05)
        if self.engine is not None and self.inflight:
            await anyio.to_thread.run_sync(self.engine.cancel_all)


def _sse(data: dict) -> str:
    return f"data: {json.dumps(data, ensure_ascii=False)}\n\n"


def _error(e: RequestError) -> JSONResponse:
    return JSONResponse(e.body(), status_code=e.status)


async def _read_json(request: Request):
    size = request.headers.get("content-length")
    if size is not None and (not size.isdigit() or int(size) > MAX_BODY):
        raise RequestError(f"the request body is larger than {MAX_BODY} bytes", status=413, code="body_too_large")
    raw = bytearray()
    async for part in request.stream():
        raw += part
        if len(raw) > MAX_BODY:
            raise RequestError(f"the request body is larger than {MAX_BODY} bytes", status=413, code="body_too_large")
    try:
        return json.loads(raw)
    except (ValueError, RecursionError) as e:
        raise RequestError(f"the request body is not valid JSON: {str(e)[:120]}") from None


def create_app(engine_or_loader, config: ServeConfig) -> Starlette:
    """The ASGI app. engine_or_loader: an Engine, or a function returning one (called in a thread, so the
    server answers /health with 503 while the models load)."""
    server = Server(engine_or_loader, config)

    async def not_found(request: Request, exc: Exception) -> Response:
        return _error(RequestError(f"no route {request.method} {request.url.path}", status=404, code="not_found"))

    async def refused(request: Request, exc: RequestError) -> Response:
        return _error(exc)

    async def failed(request: Request, exc: Exception) -> Response:  # never a traceback to the client
        return _error(RequestError(f"internal error: {type(exc).__name__}", status=500, code="server_error"))

    routes = [
        Route("/v1/completions", server.completions, methods=["POST"]),
        Route("/v1/chat/completions", server.chat, methods=["POST"]),
        Route("/v1/models", server.models, methods=["GET"]),
        Route("/health", server.health, methods=["GET"]),
        Route("/metrics", server.prometheus, methods=["GET"]),
    ]

    @contextlib.asynccontextmanager
    async def lifespan(app):
        yield
        await server.drain()  # SIGINT / SIGTERM: stop admitting, finish or cancel what runs

    app = Starlette(
        routes=routes,
        exception_handlers={404: not_found, 405: not_found, RequestError: refused, Exception: failed},
        lifespan=lifespan,
    )
    app.state.server = server
    return app


def serve(engine_loader: Callable, config: ServeConfig, host: str, port: int) -> None:
    """Run the server until SIGINT/SIGTERM (uvicorn: stop accepting, let running requests finish for
    `drain_s` seconds, then cancel them)."""
    import uvicorn

    app = create_app(engine_loader, config)
    uvicorn.run(app, host=host, port=port, log_level="warning", timeout_graceful_shutdown=int(config.drain_s))
