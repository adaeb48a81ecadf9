"""OpenAI-style error bodies: ``{"error": {"message", "type", "param", "code"}}``."""

from __future__ import annotations

from fastapi.responses import JSONResponse

ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    503: "service_unavailable",
    504: "timeout_error",
}


class APIError(Exception):
    """An error a client caused (or may retry); turned into a JSON error response.

    ``retry_after`` (seconds) becomes a ``Retry-After`` header: the server is
    overloaded or shutting down, and the client may try again later.
    """

    def __init__(
        self,
        message: str,
        status: int = 400,
        param: str | None = None,
        code: str | None = None,
        retry_after: int | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.param = param
        self.code = code
        self.retry_after = retry_after


class ClientGone(Exception):
    """The client closed the connection before the answer was ready (answered with 499)."""


def error_body(
    message: str, status: int, param: str | None = None, code: str | None = None
) -> dict[str, object]:
    return {
        "error": {
            "message": message,
            "type": ERROR_TYPES.get(
                status, "invalid_request_error" if status < 500 else "server_error"
            ),
            "param": param,
            "code": code,
        }
    }


def error_response(exc: APIError) -> JSONResponse:
    headers = None if exc.retry_after is None else {"Retry-After": str(exc.retry_after)}
    return JSONResponse(
        error_body(exc.message, exc.status, exc.param, exc.code),
        status_code=exc.status,
        headers=headers,
    )
