"""The HTTP floor: a bare ASGI app under uvicorn as `piloop serve` runs it (uvloop, httptools, no access log, the
same keep-alive), answering every request with a constant. The bench sends it the heartbeats it sends piloop, at
the same pace from as many connections, so the server's CPU for them reads beside what the HTTP server alone costs
on this machine at this moment (a shared machine's speed moves by half within an hour).

    python bench/floor.py PORT
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import uvicorn

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from piloop_common.sdk.client import SERVER_KEEPALIVE_SECONDS

ANSWER = b'{"jobs":{}}'


async def app(scope: dict, receive, send) -> None:
    if scope["type"] != "http":
        return
    while (await receive()).get("more_body"):
        pass  # the body is read, as a real handler would
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": ANSWER})


def main() -> None:
    try:
        import uvloop
    except ImportError:  # as `piloop serve`: asyncio's own loop where uvloop is missing
        uvloop = None
    config = uvicorn.Config(
        app,
        host="127.0.0.1",
        port=int(sys.argv[1]),
        lifespan="off",
        log_level="warning",
        access_log=False,
        timeout_keep_alive=SERVER_KEEPALIVE_SECONDS,
        proxy_headers=False,
    )
    with asyncio.Runner(loop_factory=uvloop.new_event_loop if uvloop else None) as runner:
        runner.run(uvicorn.Server(config).serve())


if __name__ == "__main__":
    main()
