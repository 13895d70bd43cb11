"""The HTTP layer: FastAPI routes over one EngineWorker.

    /v1/chat/completions   streaming (SSE) and plain replies, OpenAI's format plus `timings` and `tandem`
    /v1/models             the one model served
    /health                {"status": "ok"}; needs no key
    /metrics               Prometheus text: request counts, vLLM-named speculative counters, cancel latency

A stream is answered only once the engine has started on it, so an error it raises before the first
token (a prompt past the context, a setting out of range) is a proper 400 rather than a broken stream.

Who may call it is checked first (engine.server.guard: Host, Origin), then how the body is sent
(engine.server.body: JSON, its size, depth and text), then what it asks (engine.server.schemas).
"""

from __future__ import annotations

import asyncio
import hmac
import json
import time
import uuid
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.middleware.cors import CORSMiddleware

from engine.backend import ChatBackend
from engine.errors import ContextOverflowError, SettingsError, TandemError
from engine.events import Finished, RoundStats, TextPiece
from engine.server import schemas
from engine.server.body import BODY_TIMEOUT_S, ClientGone, read_json
from engine.server.guard import CLIENT_GONE, RequestGuard
from engine.server.metrics import ServerMetrics
from engine.server.schemas import ApiError
from engine.server.worker import EngineWorker, Job, ServerBusy
from engine.settings import SamplingSettings

DISCONNECT_POLL_S = 0.1


@dataclass
class _Done:
    result: Finished | BaseException


class _ClientGone(Exception):
    pass


def create_app(
    backend: ChatBackend,
    model_name: str,
    *,
    api_key: str | None = None,
    max_queue: int = 4,
    defaults: SamplingSettings | None = None,
    context_length: int | None = None,
    bound_host: str = "127.0.0.1",
    allow_hosts: Iterable[str] = (),
    cors_origins: Iterable[str] = (),
    body_timeout_s: float = BODY_TIMEOUT_S,
) -> FastAPI:
    """An app serving `backend` as `model_name`. With `api_key`, every /v1 and /metrics call needs it;
    without one, only requests for `bound_host`, localhost, a loopback address or one of `allow_hosts`
    are served. Browser requests from another origin are refused unless `cors_origins` names it. A body
    must arrive within `body_timeout_s` of its headers."""
    defaults = defaults or SamplingSettings()
    metrics = ServerMetrics()
    worker = EngineWorker(backend, max_queue, metrics)
    app = FastAPI(title="Tandem", docs_url=None, redoc_url=None, openapi_url=None)
    cors_origins = list(cors_origins)
    if cors_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=cors_origins,
            allow_methods=["GET", "POST"],
            allow_headers=["Authorization", "Content-Type"],
            allow_private_network=True,
        )
    app.add_middleware(
        RequestGuard,
        metrics=metrics,
        cors_origins=cors_origins,
        allowed_hosts=None if api_key else ["localhost", bound_host, *allow_hosts],
    )
    app.state.worker = worker
    app.state.metrics = metrics
    app.router.add_event_handler("shutdown", worker.stop)
    expected_key = api_key.encode() if api_key else None

    def check_key(request: Request) -> None:
        if expected_key is None:
            return
        header = request.headers.get("authorization", "")
        given = header[7:].strip() if header[:7].lower() == "bearer " else ""
        if not hmac.compare_digest(given.encode(), expected_key):
            raise ApiError(
                401,
                "A valid API key is required (Authorization: Bearer <key>).",
                "authentication_error",
                code="invalid_api_key",
            )

    @app.exception_handler(ApiError)
    async def api_error(request: Request, error: ApiError) -> JSONResponse:
        headers = {"Retry-After": "1"} if error.status == 503 else None
        return JSONResponse(error.body(), status_code=error.status, headers=headers)

    @app.exception_handler(ClientGone)
    async def client_gone(request: Request, error: ClientGone) -> PlainTextResponse:
        """A client that hung up during its upload: nobody reads the answer, and it is no error here."""
        metrics.count_request("disconnected")
        return PlainTextResponse("", status_code=CLIENT_GONE)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, error: StarletteHTTPException) -> JSONResponse:
        message = "Not found." if error.status_code == 404 else str(error.detail)
        return JSONResponse(ApiError(error.status_code, message).body(), status_code=error.status_code)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, error: RequestValidationError) -> JSONResponse:
        return JSONResponse(ApiError(400, str(error)).body(), status_code=400)

    @app.exception_handler(Exception)
    async def server_error(request: Request, error: Exception) -> JSONResponse:
        """A bug: still an error object (the traceback goes to the log). Answered outside the guard,
        so counted here."""
        metrics.count_error(500)
        body = ApiError(500, f"The server failed: {error.__class__.__name__}.", "server_error").body()
        return JSONResponse(body, status_code=500)

    @app.get("/health")
    async def health() -> dict:
        return {"status": "ok", "model": model_name, "queue_depth": metrics.queue_depth}

    @app.get("/v1/models")
    async def models(request: Request) -> dict:
        check_key(request)
        entry = {"id": model_name, "object": "model", "created": 0, "owned_by": "tandem"}
        if context_length:
            entry["max_model_len"] = context_length
        return {"object": "list", "data": [entry]}

    @app.get("/metrics")
    async def prometheus(request: Request) -> PlainTextResponse:
        check_key(request)
        return PlainTextResponse(metrics.render(model_name), media_type="text/plain; version=0.0.4")

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        check_key(request)
        body = await read_json(request, body_timeout_s)
        chat = schemas.parse_chat_request(body, model_name, defaults, context_length)
        loop = asyncio.get_running_loop()
        events: asyncio.Queue = asyncio.Queue()

        def on_event(event) -> None:
            if isinstance(event, TextPiece | RoundStats):
                loop.call_soon_threadsafe(events.put_nowait, event)

        def on_done(result) -> None:
            loop.call_soon_threadsafe(events.put_nowait, _Done(result))

        job = Job(chat.messages, chat.sampling, on_event, on_done)
        try:
            worker.submit(job)
        except ServerBusy:
            metrics.count_request("busy")
            raise ApiError(
                503,
                "The server is busy: too many requests are waiting. Try again shortly.",
                "server_error",
                code="server_busy",
            ) from None
        request_id = f"chatcmpl-{uuid.uuid4().hex}"
        created = int(time.time())
        try:
            first = await _next(events, request, worker, job)
        except _ClientGone:
            metrics.count_request("cancelled")
            return PlainTextResponse("", status_code=CLIENT_GONE)
        if isinstance(first, _Done) and isinstance(first.result, BaseException):
            metrics.count_request("error")
            raise _as_api_error(first.result)
        if chat.stream:
            stream = _sse(first, events, request, worker, job, chat, request_id, created, model_name, metrics)
            return StreamingResponse(
                stream, media_type="text/event-stream", headers={"Cache-Control": "no-cache"}
            )
        try:
            item = first
            while not isinstance(item, _Done):
                item = await _next(events, request, worker, job)
        except _ClientGone:
            metrics.count_request("cancelled")
            return PlainTextResponse("", status_code=CLIENT_GONE)
        if isinstance(item.result, BaseException):
            metrics.count_request("error")
            raise _as_api_error(item.result)
        finished = item.result
        metrics.count_request("completed")
        return schemas.completion(
            request_id, created, model_name, finished.text, finished.reason, finished.stats
        )

    return app


async def _next(events: asyncio.Queue, request: Request, worker: EngineWorker, job: Job):
    """The next event of `job`, cancelling it if the client goes away while we wait.

    The client is asked about at least every DISCONNECT_POLL_S, also while events arrive faster than
    that (a fast reply would otherwise never notice a client that left)."""
    while True:
        if time.monotonic() - job.disconnect_checked_at >= DISCONNECT_POLL_S:
            job.disconnect_checked_at = time.monotonic()
            if await request.is_disconnected():
                worker.cancel(job)
                raise _ClientGone from None
        try:
            return await asyncio.wait_for(events.get(), DISCONNECT_POLL_S)
        except TimeoutError:
            job.disconnect_checked_at = 0.0  # ask now


async def _sse(
    first, events, request, worker, job, chat, request_id, created, model, metrics
) -> AsyncIterator[str]:
    """Chunks of one streamed reply: a role chunk, one chunk per round, the final chunk with the stats."""

    def data(payload: dict) -> str:
        return f"data: {json.dumps(payload)}\n\n"

    done = False
    try:
        yield data(schemas.chunk(request_id, created, model, {"role": "assistant", "content": ""}))
        pending, item = "", first
        while True:
            if isinstance(item, TextPiece):
                pending += item.text
            elif isinstance(item, RoundStats):
                if pending:
                    yield data(
                        schemas.chunk(
                            request_id,
                            created,
                            model,
                            {"content": pending},
                            tandem=schemas.progress_fields(item.stats),
                        )
                    )
                    pending = ""
            elif isinstance(item, _Done):
                break
            item = await events.get()
        done = True
        result = item.result
        if isinstance(result, BaseException):
            metrics.count_request("error")
            yield data(_as_api_error(result).body())
            return
        if pending:
            yield data(schemas.chunk(request_id, created, model, {"content": pending}))
        stats = result.stats
        final = schemas.chunk(
            request_id,
            created,
            model,
            {},
            schemas.FINISH_REASONS.get(result.reason, result.reason),
            timings=schemas.timings(stats),
            tandem=schemas.tandem_fields(stats),
        )
        if chat.include_usage:
            yield data(final)
            final = schemas.chunk(request_id, created, model, {}, usage=schemas.usage(stats))
            final["choices"] = []
        else:
            final["usage"] = schemas.usage(stats)
        yield data(final)
        yield "data: [DONE]\n\n"
        metrics.count_request("cancelled" if result.reason == "cancelled" else "completed")
    finally:
        if not done:  # the client went away mid-stream (the response task was cancelled)
            worker.cancel(job)
            metrics.count_request("cancelled")


def _as_api_error(error: BaseException) -> ApiError:
    if isinstance(error, ApiError):
        return error
    if isinstance(error, ContextOverflowError):  # the facts: the app's advice is not an API client's
        return ApiError(400, error.facts, param="messages", code="context_length_exceeded")
    if isinstance(error, SettingsError):
        return ApiError(400, str(error))
    if isinstance(error, TandemError):
        return ApiError(400, str(error))
    return ApiError(500, f"Generation failed: {error}", "server_error")
