"""The HTTP side: a FastAPI app in front of the engine (specdec.serve.engine). Routes: POST
/v1/completions, POST /v1/chat/completions, GET /v1/models, GET /health, GET /metrics. Bodies are read
and checked by hand (specdec.serve.protocol) so that every error has OpenAI's shape and status; each
request's rows reach the engine's queue, and their tokens come back through an asyncio queue of the
request's own, fed from the engine thread."""
from __future__ import annotations

import asyncio
import hmac
import json
import logging
import threading
import time
import uuid
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Callable

import anyio
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..errors import InputError
from .engine import Engine, EngineStopped, QueueFull
from .metrics import Metrics
from .protocol import APIError, parse

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 4 * 2 ** 20            # a request body past this is answered 413
DISCONNECT_CHECK_S = 0.2                # how often a whole (not streamed) answer looks for a closed connection
FINISH_REASONS = {"eos": "stop", "stop": "stop", "length": "length"}


@dataclass
class ServerState:
    """What the routes share: the Speculator (None while loading), its engine and metrics."""
    model_name: str
    api_key: str | None
    max_batch: int
    max_queue: int
    max_body_bytes: int
    metrics: Metrics = field(default_factory=Metrics)
    speculator: Any = None
    engine: Engine | None = None
    load_error: str | None = None
    created: int = field(default_factory=lambda: int(time.time()))

    def ready(self, speculator) -> None:
        self.speculator = speculator
        self.engine = Engine(speculator, self.max_batch, self.max_queue, self.metrics).start()
        self.metrics.watch(self.engine)

    @property
    def strategy(self) -> str:
        sd = self.speculator
        return sd.config.strategy if getattr(sd, "config", None) is not None else getattr(sd.strategy, "name", "?")


def create_app(speculator=None, *, load: Callable[[], Any] | None = None, model_name: str = "specdec",
               api_key: str | None = None, max_batch: int = 16, max_queue: int = 256,
               max_body_bytes: int = MAX_BODY_BYTES, on_load_error: Callable[[str], None] | None = None) -> FastAPI:
    """The server's app over `speculator`, or over what `load()` returns (called in a thread at startup:
    /health answers 503 until it is done). The engine stops when the app shuts down."""
    if (speculator is None) == (load is None):
        raise ValueError("create_app needs a speculator or a load function (one of them)")
    state = ServerState(model_name, api_key or None, max_batch, max_queue, max_body_bytes)
    if speculator is not None:
        state.ready(speculator)

    async def lifespan(app):
        if load is not None:
            threading.Thread(target=_load_in_thread, args=(state, load, on_load_error), name="specdec-load",
                             daemon=True).start()
        yield
        if state.engine is not None:
            await anyio.to_thread.run_sync(state.engine.stop)

    app = FastAPI(title="specdec", docs_url=None, redoc_url=None, openapi_url=None, lifespan=lifespan)
    app.state.specdec = state
    app.add_middleware(_CountResponses, metrics=state.metrics)

    @app.exception_handler(APIError)
    async def api_error(request: Request, exc: APIError):
        return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException):
        message = {404: f"no route {request.url.path!r}: this server has /v1/completions, /v1/chat/completions, "
                        f"/v1/models, /health and /metrics",
                   405: f"{request.method} is not allowed on {request.url.path}"}.get(exc.status_code, str(exc.detail))
        return JSONResponse(APIError(exc.status_code, message).body(), status_code=exc.status_code)

    @app.exception_handler(Exception)
    async def internal_error(request: Request, exc: Exception):
        log.exception("internal error on %s", request.url.path)
        return JSONResponse(APIError(500, f"internal server error: {type(exc).__name__}: {exc}").body(),
                            status_code=500)

    @app.get("/health")
    async def health():
        if state.load_error is not None:
            return JSONResponse({"status": "error", "message": state.load_error}, status_code=503)
        if state.engine is None:
            return JSONResponse({"status": "loading"}, status_code=503)
        if not state.engine.alive:
            return JSONResponse({"status": "error", "message": repr(state.engine.error)}, status_code=503)
        return {"status": "ok"}

    @app.get("/metrics")
    async def metrics():
        data, content_type = state.metrics.exposition()
        return Response(data, media_type=content_type)

    @app.get("/v1/models")
    async def models(request: Request):
        _authorize(state, request)
        return {"object": "list", "data": [_model_card(state)]}

    @app.get("/v1/models/{model:path}")
    async def model(model: str, request: Request):
        _authorize(state, request)
        if model != state.model_name:
            raise _unknown_model(state, model)
        return _model_card(state)

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await _generate(state, request, "completion")

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await _generate(state, request, "chat")

    return app


def _load_in_thread(state: ServerState, load, on_load_error) -> None:
    try:
        state.ready(load())
        log.info("specdec serve: the model is loaded, serving")
    except BaseException as exc:  # noqa: BLE001 - reported by /health and by the command
        state.load_error = f"{type(exc).__name__}: {exc}"
        log.error("specdec serve: loading failed: %s", state.load_error)
        if on_load_error is not None:
            on_load_error(state.load_error)


def _model_card(state: ServerState) -> dict:
    return {"id": state.model_name, "object": "model", "created": state.created, "owned_by": "specdec"}


def _unknown_model(state: ServerState, model: str) -> APIError:
    return APIError(404, f"the model {model!r} does not exist: this server serves {state.model_name!r}", "model",
                    "model_not_found")


class _CountResponses:
    """ASGI middleware: every HTTP answer counted by route and status (specdec:http_requests_total).
    Plain ASGI, not BaseHTTPMiddleware, which would buffer the streamed answers."""

    def __init__(self, app, metrics: Metrics):
        self.app, self.metrics = app, metrics

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = scope.get("path", "")
        route = path if path in ("/v1/completions", "/v1/chat/completions", "/v1/models", "/health", "/metrics") \
            else ("/v1/models/{model}" if path.startswith("/v1/models/") else "other")

        async def counted(message):
            if message["type"] == "http.response.start":
                self.metrics.http.labels(route=route, status=str(message["status"])).inc()
            await send(message)
        return await self.app(scope, receive, counted)


# ---------------------------------------------------------------------- the checks before a request runs
def _authorize(state: ServerState, request: Request) -> None:
    """--api-key: a Bearer token on /v1/*, compared in constant time."""
    if state.api_key is None:
        return
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if not header:
        raise APIError(401, "no API key: send it as the header 'Authorization: Bearer KEY'", None,
                       "invalid_api_key", headers={"WWW-Authenticate": "Bearer"})
    if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), state.api_key.encode()):
        raise APIError(401, "the API key is not valid", None, "invalid_api_key", headers={"WWW-Authenticate": "Bearer"})


async def _read_json(state: ServerState, request: Request) -> Any:
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if content_type != "application/json":
        raise APIError(415, f"the request body must be JSON sent with 'Content-Type: application/json', got "
                            f"{content_type or 'no Content-Type'!r}", None, "unsupported_media_type")
    limit = state.max_body_bytes
    declared = request.headers.get("content-length")
    too_large = APIError(413, f"the request body is larger than this server's limit of {limit} bytes", None,
                         "body_too_large")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise too_large
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise too_large
        chunks.append(chunk)
    try:
        return json.loads(b"".join(chunks))
    except (ValueError, RecursionError) as exc:      # JSONDecodeError, UnicodeDecodeError
        raise APIError(400, f"the request body is not valid JSON: {exc}", None, "invalid_json") from None


def _prompt_of(state: ServerState, kind: str, prompt):
    """A completion's prompt as it is; a chat's messages rendered by the tokenizer's chat template."""
    if kind != "chat":
        return prompt
    tokenizer = state.speculator.tokenizer
    if tokenizer is None or not getattr(tokenizer, "chat_template", None):
        raise APIError(400, "this model's tokenizer has no chat template, so /v1/chat/completions cannot build a "
                            "prompt: use /v1/completions, or serve a tokenizer that has one (target.tokenizer=...)",
                       "messages", "no_chat_template")
    try:
        text = tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
    except Exception as exc:  # noqa: BLE001 - a template's own raise_exception() (e.g. roles must alternate)
        raise APIError(400, f"the chat template refused these messages: {exc}", "messages") from None
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def _input_error(exc: InputError) -> APIError:
    """A library InputError in the server's words (its max_tokens is the library's max_new_tokens)."""
    message = str(exc).replace("max_new_tokens", "max_tokens")
    param = "max_tokens" if "max_tokens" in message else ("prompt" if "prompt" in message else None)
    return APIError(400, message, param)


# ---------------------------------------------------------------------- running a request
class _Choice:
    """One row's text as it grows: pieces to stream (a trailing incomplete character and a possible
    start of a stop string held back) and the final text (cut before the stop string, as OpenAI's)."""

    def __init__(self, tokenizer, stop: tuple[str, ...]):
        self.tokenizer, self.stop = tokenizer, stop
        self.hold = max((len(s) for s in stop), default=1) - 1
        self.token_ids: list[int] = []
        self.shown = ""
        self.reason: str | None = None
        self.stats = None

    def text(self) -> str:
        return self.tokenizer.decode(self.token_ids, skip_special_tokens=True) if self.tokenizer is not None else ""

    def add(self, run: list[int], reason: str | None) -> str:
        """The new piece to send after `run` (maybe empty)."""
        self.token_ids.extend(run)
        text = self.text()
        if reason is None:
            ready = text[:-1] if text.endswith("\ufffd") else text
            ready = ready[:len(ready) - self.hold] if self.hold else ready
        else:
            self.reason = reason
            ready = text
            if reason == "stop" and self.stop:
                found = [i for i in (text.find(s) for s in self.stop) if i >= 0]
                if found:
                    ready = text[:min(found)]
        if len(ready) > len(self.shown) and ready.startswith(self.shown):
            piece, self.shown = ready[len(self.shown):], ready
            return piece
        return ""


def _usage(prompt_tokens: int, choices: list[_Choice]) -> dict:
    completion = sum(len(c.token_ids) for c in choices)
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion, "total_tokens": prompt_tokens + completion}


def _spec_summary(state: ServerState, choices: list[_Choice]) -> dict:
    """The `specdec` object beside `usage` (as llama.cpp adds `timings`)."""
    stats = [c.stats for c in choices if c.stats is not None]
    tokens = sum(s.new_tokens for s in stats)
    forwards = sum(s.target_forwards for s in stats)
    drafted = sum(s.proposed_nodes for s in stats)
    accepted = sum(sum(s.accepted_lengths) for s in stats)
    seconds = max((s.total_time_s for s in stats), default=0.0)
    return {"strategy": state.strategy, "verify_steps": forwards, "drafted_tokens": drafted,
            "accepted_tokens": accepted, "tokens_per_forward": round(tokens / forwards, 4) if forwards else 0.0,
            "acceptance_rate": round(accepted / drafted, 4) if drafted else 0.0,
            "tokens_per_second": round(tokens / seconds, 2) if seconds else 0.0}


async def _generate(state: ServerState, request: Request, kind: str):
    arrived = time.perf_counter()
    _authorize(state, request)
    if state.load_error is not None:
        raise APIError(503, f"the model could not be loaded: {state.load_error}", None, "load_failed")
    if state.engine is None:
        raise APIError(503, "the model is still loading: retry when GET /health answers 200", None, "loading",
                       headers={"Retry-After": "5"})
    body = await _read_json(state, request)
    req = parse(body, kind)
    if req.model is not None and req.model != state.model_name:
        raise _unknown_model(state, req.model)
    engine, sd = state.engine, state.speculator
    jobs, prompt_tokens = [], 0
    for k, (prompt, args) in enumerate(req.rows()):
        first_choice = k % req.n == 0        # the other choices of a prompt reuse its ids (one template render)
        try:
            job = sd.batch_job(engine.new_index(), _prompt_of(state, kind, prompt) if first_choice
                               else jobs[-1].prompt_ids, **args)
        except InputError as exc:
            raise _input_error(exc) from None
        if first_choice:
            prompt_tokens += len(job.prompt_ids)
        jobs.append(job)
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue = asyncio.Queue()

    def deliver(choice: int, run, reason, error) -> None:        # on the engine thread
        loop.call_soon_threadsafe(queue.put_nowait, (choice, run, reason, error))

    try:
        engine.submit(jobs, [partial(deliver, choice) for choice in range(len(jobs))])
    except QueueFull as exc:
        raise APIError(503, str(exc), None, "queue_full", headers={"Retry-After": "1"}) from None
    except EngineStopped as exc:
        raise APIError(503, str(exc), None, "shutting_down") from None
    for job in jobs:
        state.metrics.prompt_tokens.inc(len(job.prompt_ids))
    run = _Run(state, req, kind, jobs, queue, prompt_tokens, arrived)
    if req.stream:
        return _Stream(run.events(), media_type="text/event-stream",
                       headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
    return await run.whole(request)


class _Run:
    """One request's rows on their way through the engine."""

    def __init__(self, state: ServerState, req, kind: str, jobs, queue: asyncio.Queue, prompt_tokens: int,
                 arrived: float):
        self.state, self.req, self.kind, self.jobs, self.queue = state, req, kind, jobs, queue
        self.prompt_tokens, self.arrived = prompt_tokens, arrived
        self.choices = [_Choice(state.speculator.tokenizer, req.stop) for _ in jobs]
        self.id = ("chatcmpl-" if kind == "chat" else "cmpl-") + uuid.uuid4().hex
        self.created = int(time.time())
        self.first_at: float | None = None
        self.last_at = arrived

    def cancel(self) -> None:
        self.state.engine.cancel([job.index for job, c in zip(self.jobs, self.choices) if c.reason is None])

    async def next(self) -> tuple[int, str]:
        """(choice, new piece) of the next delivery; raises APIError for an engine error."""
        choice, run, reason, error = await self.queue.get()
        if error is not None:
            self.choices[choice].reason = "error"
            raise APIError(500, error, None, "generation_failed")
        c = self.choices[choice]
        if run:
            now = time.perf_counter()
            metrics = self.state.metrics
            if self.first_at is None:
                self.first_at = now
                metrics.ttft.observe(now - self.arrived)
            else:                         # a step's tokens came together: each waited its share of the gap
                for _ in run:
                    metrics.itl.observe((now - self.last_at) / len(run))
            self.last_at = now
        piece = c.add(run, reason)
        if reason is not None:
            c.stats = self.jobs[choice].stats
            if all(ch.reason is not None for ch in self.choices):
                self.state.metrics.e2e.observe(time.perf_counter() - self.arrived)
        return choice, piece

    @property
    def pending(self) -> bool:
        return any(c.reason is None for c in self.choices)

    def _finish(self, c: _Choice) -> str:
        return FINISH_REASONS.get(c.reason, c.reason)

    async def whole(self, request: Request) -> JSONResponse:
        checked = time.monotonic()
        try:
            while self.pending:
                try:
                    await asyncio.wait_for(self.next(), timeout=DISCONNECT_CHECK_S)
                except asyncio.TimeoutError:
                    pass
                if time.monotonic() - checked >= DISCONNECT_CHECK_S:
                    checked = time.monotonic()
                    if await request.is_disconnected():        # the client went away: free its rows
                        self.cancel()
                        return JSONResponse({}, status_code=499)
        finally:
            if self.pending:
                self.cancel()
        if self.kind == "chat":
            choices = [{"index": i, "message": {"role": "assistant", "content": c.shown}, "logprobs": None,
                        "finish_reason": self._finish(c)} for i, c in enumerate(self.choices)]
            obj = "chat.completion"
        else:
            choices = [{"index": i, "text": c.shown, "logprobs": None, "finish_reason": self._finish(c)}
                       for i, c in enumerate(self.choices)]
            obj = "text_completion"
        return JSONResponse({"id": self.id, "object": obj, "created": self.created, "model": self.state.model_name,
                             "choices": choices, "usage": _usage(self.prompt_tokens, self.choices),
                             "specdec": _spec_summary(self.state, self.choices)})

    def _chunk(self, choices: list[dict], **extra) -> str:
        obj = "chat.completion.chunk" if self.kind == "chat" else "text_completion"
        data = {"id": self.id, "object": obj, "created": self.created, "model": self.state.model_name,
                "choices": choices, **extra}
        return f"data: {json.dumps(data, ensure_ascii=False)}\n\n"

    def _choice_chunk(self, i: int, piece: str | None, finish: str | None, role: bool = False) -> dict:
        if self.kind == "chat":
            delta = {"role": "assistant", "content": ""} if role else ({} if piece is None else {"content": piece})
            return {"index": i, "delta": delta, "logprobs": None, "finish_reason": finish}
        return {"index": i, "text": piece or "", "logprobs": None, "finish_reason": finish}

    async def events(self):
        """The SSE events: (chat) the role first, then each piece, one finish_reason per choice, usage
        when asked, then [DONE]. An engine error mid-stream is sent as an `error` event."""
        try:
            if self.kind == "chat":
                for i in range(len(self.choices)):
                    yield self._chunk([self._choice_chunk(i, None, None, role=True)])
            while self.pending:
                try:
                    i, piece = await self.next()
                except APIError as exc:
                    yield f"data: {json.dumps(exc.body())}\n\n"
                    break
                c = self.choices[i]
                if c.reason is not None:
                    extra = {"specdec": _spec_summary(self.state, [c])}
                    yield self._chunk([self._choice_chunk(i, piece or None, self._finish(c))], **extra)
                elif piece:
                    yield self._chunk([self._choice_chunk(i, piece, None)])
            else:
                if self.req.include_usage:
                    yield self._chunk([], usage=_usage(self.prompt_tokens, self.choices),
                                      specdec=_spec_summary(self.state, self.choices))
            yield "data: [DONE]\n\n"
        finally:
            if self.pending:                 # the client went away (or the server is stopping)
                self.cancel()


class _Stream(StreamingResponse):
    """A streamed answer that always watches for the client's disconnect while it waits for the next
    step (whatever ASGI version the server speaks): a closed stream cancels its rows at once."""

    async def __call__(self, scope, receive, send) -> None:
        async with anyio.create_task_group() as group:
            async def watch():
                await self.listen_for_disconnect(receive)
                group.cancel_scope.cancel()
            group.start_soon(watch)
            try:
                await self.stream_response(send)
            except OSError:
                pass
            group.cancel_scope.cancel()
