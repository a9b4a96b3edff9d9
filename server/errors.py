"""HTTP errors with the OpenAI error body, and the mapping from lucebox's exceptions.

Body: ``{"error": {"message": str, "type": str, "param": str | None, "code": str | None}}``.

Mapping (`api_error_from`): invalid requests and `ConfigError` (bad sampling values, a prompt
longer than the context) -> 400 ``invalid_request_error``; `UnsupportedError` -> 400;
`OutOfMemoryError` -> 503 ``server_error``/``out_of_memory``; any other exception -> 500
``server_error``. The message of an unexpected exception is kept (it helps the operator) but
never a traceback.
"""
from __future__ import annotations

from typing import Any, Mapping

from lucebox.errors import ConfigError, LuceboxError, OutOfMemoryError, UnsupportedError

__all__ = ["APIError", "api_error_from", "error_body"]


def error_body(message: str, type_: str, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


class APIError(Exception):
    """An error answered as an HTTP status with the OpenAI error body."""

    def __init__(self, status: int, message: str, *, type_: str | None = None, param: str | None = None,
                 code: str | None = None, headers: Mapping[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type_ or ("invalid_request_error" if 400 <= status < 500 else "server_error")
        self.param = param
        self.code = code
        self.headers = dict(headers or {})

    def body(self) -> dict[str, Any]:
        return error_body(self.message, self.type, self.param, self.code)


def invalid(message: str, param: str | None = None, code: str | None = None) -> APIError:
    """A 400 invalid_request_error."""
    return APIError(400, message, param=param, code=code)


def api_error_from(exc: BaseException) -> APIError:
    """The HTTP error for an exception raised while preparing or running a generation."""
    if isinstance(exc, APIError):
        return exc
    if isinstance(exc, OutOfMemoryError):
        return APIError(503, f"out of memory: {exc}", type_="server_error", code="out_of_memory",
                        headers={"Retry-After": "5"})
    if isinstance(exc, ConfigError):
        msg = str(exc)
        code = "context_length_exceeded" if "context" in msg and "overflow" in msg else "invalid_value"
        return APIError(400, msg, code=code)
    if isinstance(exc, UnsupportedError):
        return APIError(400, str(exc), code="unsupported")
    if isinstance(exc, LuceboxError):
        return APIError(500, f"generation failed: {exc}", type_="server_error", code="engine_error")
    if isinstance(exc, MemoryError):
        return APIError(503, "out of memory", type_="server_error", code="out_of_memory",
                        headers={"Retry-After": "5"})
    return APIError(500, f"internal error: {type(exc).__name__}: {exc}", type_="server_error",
                    code="internal_error")
