"""`create_app(config)`: the FastAPI application, its error mapping and its small endpoints.

Every error leaves as the OpenAI error body (`errors`): request validation and invalid JSON
-> 400, unknown routes -> 404, a full queue -> 429 with Retry-After, engine failures -> 500 /
503. An exception in one request is answered (500) and logged; the server keeps serving.
"""
from __future__ import annotations

import html
import logging
from importlib import resources
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .config import ServerConfig
from .errors import APIError, api_error_from
from .scheduler import QueueFullError
from .service import Service
from .streaming import ClientDisconnected

__all__ = ["create_app", "load_engine"]

log = logging.getLogger("lucebox.server")


def load_engine(config: ServerConfig) -> Any:
    """Load the engine `config` describes (blocking; raises lucebox errors)."""
    import lucebox
    from lucebox import _core

    ctx = config.ctx
    if ctx is None:
        ctx = min(32768, int(_core.TargetFile.open(config.model).hparams.n_ctx_train))
    return lucebox.Engine(config.model, config.draft, ctx=ctx, kv_type=config.kv_type, kv_type_k=config.kv_type_k,
                          kv_type_v=config.kv_type_v, device=config.device,
                          spec=config.spec, ubatch=config.ubatch, threads=config.threads, devices=config.devices,
                          split=config.split, layer_proportions=config.layer_proportions,
                          draft_device=config.draft_device)


class _RequestMetrics:
    """ASGI middleware counting every HTTP response by endpoint and status code."""

    def __init__(self, app: ASGIApp, service: Service) -> None:
        self.app = app
        self.service = service

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = [500]

        async def send_wrapper(message: Message) -> None:
            if message["type"] == "http.response.start":
                status[0] = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            self.service.metrics.observe_request(scope.get("path", ""), status[0])


class _JSONBodies:
    """ASGI middleware: POST bodies under /v1/ are JSON whatever Content-Type says (clients such as
    ``curl -d`` send form encoding by default); malformed JSON is then a clear 400."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope.get("method") == "POST" and scope.get("path", "").startswith("/v1/"):
            headers = [(k, v) for k, v in scope.get("headers", []) if k != b"content-type"]
            ctype = dict(scope.get("headers", [])).get(b"content-type", b"")
            if b"json" not in ctype:
                scope = {**scope, "headers": headers + [(b"content-type", b"application/json")]}
        await self.app(scope, receive, send)


def _error_response(err: APIError, service: Service | None, request: Request | None = None) -> JSONResponse:
    """The error as JSON: Anthropic's body on /v1/messages paths, OpenAI's elsewhere."""
    if service is not None and err.status >= 400:
        service.metrics.observe_error(err.type, err.code)
    if err.status >= 500:
        log.error("request failed: %s", err.message)
    body = err.body()
    if request is not None and request.url.path.startswith("/v1/messages"):
        from .anthropic_api import anthropic_error_body

        body = anthropic_error_body(err.status, err.message)
    return JSONResponse(body, status_code=err.status, headers=err.headers)


def _validation_message(exc: RequestValidationError) -> tuple[str, str | None, str]:
    errors = exc.errors()
    if not errors:
        return "invalid request", None, "invalid_request"
    first = errors[0]
    loc: list[str] = []
    for part in first.get("loc", ())[1:] if first.get("loc", ("",))[0] == "body" else first.get("loc", ()):
        if isinstance(part, int):
            loc.append(f"[{part}]")
        elif isinstance(part, str) and part.isidentifier():
            loc.append(("." if loc else "") + part)
        else:
            break  # a union member's tag, not a field
    param = "".join(loc) or None
    kind = first.get("type", "")
    if kind == "json_invalid":
        detail = (first.get("ctx") or {}).get("error") or first.get("msg", "")
        return f"the request body is not valid JSON: {detail}", None, "invalid_json"
    if kind == "missing":
        return f"missing required parameter: {param}", param, "missing_required_parameter"
    msg = first.get("msg", "invalid value")
    more = f" (and {len(errors) - 1} more problem(s))" if len(errors) > 1 else ""
    return f"invalid value for {param or 'the request body'}: {msg}{more}", param, "invalid_value"


def create_app(config: ServerConfig, engine: Any = None) -> FastAPI:
    """The server application for `config`. Loads the engine unless one is given (tests pass
    their own). The app's state holds the `Service` as ``app.state.service``."""
    if engine is None:
        engine = load_engine(config)
    service = Service(config, engine)

    async def require_key(request: Request) -> None:
        key = config.api_key
        if not key:
            return
        auth = request.headers.get("authorization", "")
        given = auth[7:].strip() if auth.lower().startswith("bearer ") else request.headers.get("x-api-key")
        if given != key:
            raise APIError(401, "invalid or missing API key (send 'Authorization: Bearer KEY')",
                           type_="authentication_error", code="invalid_api_key")

    app = FastAPI(title="lucebox", version=service.fingerprint, docs_url=None, redoc_url=None,
                  openapi_url=None)
    app.state.service = service
    app.state.config = config

    from . import anthropic_api, openai_api, responses_api

    for router in (openai_api.router, anthropic_api.router, responses_api.router):
        app.include_router(router, dependencies=[Depends(require_key)])

    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError) -> JSONResponse:
        return _error_response(exc, service, request)

    @app.exception_handler(QueueFullError)
    async def _queue_full(request: Request, exc: QueueFullError) -> JSONResponse:
        service.metrics.observe_rejected()
        return _error_response(APIError(429, str(exc), type_="rate_limit_error", code="queue_full",
                                        headers={"Retry-After": str(exc.retry_after)}), service, request)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        message, param, code = _validation_message(exc)
        return _error_response(APIError(400, message, param=param, code=code), service, request)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
        message = f"{request.method} {request.url.path}: {exc.detail}"
        return _error_response(APIError(exc.status_code, message, code=code), service, request)

    @app.exception_handler(ClientDisconnected)
    async def _gone(request: Request, exc: ClientDisconnected) -> Response:
        return Response(status_code=499)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unexpected error in %s %s", request.method, request.url.path)
        return _error_response(api_error_from(exc), service, request)

    @app.get("/health")
    async def health() -> JSONResponse:
        s = service.scheduler
        return JSONResponse({"status": "ok", "model": service.model_name,
                             "slots": s.n_slots, "slots_active": s.active, "queue_depth": s.queued,
                             "context_length": service.n_ctx})

    @app.get("/metrics")
    async def metrics() -> PlainTextResponse:
        return PlainTextResponse(service.metrics.render(), media_type="text/plain; version=0.0.4")

    @app.get("/")
    async def chat_page() -> HTMLResponse:
        page = resources.files(__package__).joinpath("static", "chat.html").read_text(encoding="utf-8")
        return HTMLResponse(page.replace("{{MODEL}}", html.escape(service.model_name, quote=True)))

    app.add_middleware(_JSONBodies)
    app.add_middleware(_RequestMetrics, service=service)
    return app
