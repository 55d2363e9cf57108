"""What the app and its ASGI layer in front of it (`app.BodyLimit`) share: the JSON answer
for an error, and a body read whole handed on to the app as if it came from the client."""

from __future__ import annotations

from fastapi.responses import JSONResponse
from starlette.types import Message, Receive

from piloop_common.errors import PiloopError


def error_answer(exc: Exception) -> JSONResponse:
    """A PiloopError as its payload; anything else handed here is Redis out of reach (503)."""
    if isinstance(exc, PiloopError):
        return JSONResponse(exc.to_payload(), status_code=exc.status)
    return JSONResponse({"error": "unavailable", "message": f"the server's Redis cannot be reached: {exc}"}, 503)


def replaying(body: bytes, receive: Receive) -> Receive:
    """A `receive` that gives `body` as the whole request first, then what the client sends (its disconnect)."""
    given = False

    async def replay() -> Message:
        nonlocal given
        if not given:
            given = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay
