"""A tiny authenticating reverse proxy, as an Envoy ext_authz or an oauth2-proxy would sit in front of piloop.

It takes a caller's key from `x-api-key`, else from `Authorization: Bearer`, looks up the claims of that key,
removes any copy of the claim headers the caller sent, stamps its own, and forwards the request (the
`Authorization` header and `x-piloop-worker` pass through as sent). An unknown key gets 401 from the proxy.

    python -m tests.helpers.proxy PORT UPSTREAM KEYS_JSON
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

CLAIM_HEADERS = ("x-org-id", "x-subject-kind", "x-user-id", "x-principal")
HOP = {"host", "content-length", "transfer-encoding", "connection", "keep-alive"}


def make_app(upstream: str, keys: dict[str, dict[str, str]]):
    import httpx
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response
    from starlette.routing import Route

    client = httpx.AsyncClient(base_url=upstream, timeout=30)

    async def forward(request: Request) -> Response:
        key = request.headers.get("x-api-key")
        if not key:
            scheme, _, cred = (request.headers.get("authorization") or "").partition(" ")
            key = cred.strip() if scheme.lower() == "bearer" else ""
        claims = keys.get(key or "")
        if claims is None:
            return JSONResponse({"error": "proxy", "message": "the proxy does not know this caller"}, 401)
        headers = [
            (k, v) for k, v in request.headers.items() if k not in HOP and k not in CLAIM_HEADERS and k != "x-api-key"
        ]
        headers += [(h, claims[h]) for h in CLAIM_HEADERS if claims.get(h)]
        resp = await client.request(
            request.method, request.url.path, params=request.query_params, headers=headers, content=await request.body()
        )
        return Response(
            resp.content,
            resp.status_code,
            {k: v for k, v in resp.headers.items() if k not in HOP and k != "content-encoding"},
        )

    methods = ["GET", "POST", "PUT", "DELETE", "PATCH", "HEAD"]
    return Starlette(routes=[Route("/{path:path}", forward, methods=methods)])


class Proxy:
    """The proxy in a subprocess on `port`, in front of `upstream`."""

    def __init__(self, port: int, upstream: str, keys: dict[str, dict[str, str]], log: Path) -> None:
        self.port, self.upstream, self.keys, self.log_path = port, upstream, keys, log
        self.url = f"http://127.0.0.1:{port}"
        self.proc: subprocess.Popen | None = None

    def start(self) -> Proxy:
        import httpx

        from tests.helpers.redis import wait_for

        root = Path(__file__).resolve().parents[2]
        self.log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.helpers.proxy", str(self.port), self.upstream, json.dumps(self.keys)],
            cwd=root,
            stdout=self.log,
            stderr=self.log,
            stdin=subprocess.DEVNULL,
        )

        def up() -> bool:
            assert self.proc is not None and self.proc.poll() is None, self.log_path.read_text()
            return httpx.get(self.url + "/v1/health", timeout=1).status_code == 401

        wait_for(up, 20, interval=0.05, what=f"the test proxy on {self.url}")
        return self

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)
        self.proc = None
        self.log.close()


def main() -> None:
    import uvicorn

    port, upstream, keys = int(sys.argv[1]), sys.argv[2], json.loads(sys.argv[3])
    uvicorn.run(make_app(upstream, keys), host="127.0.0.1", port=port, log_level="warning", access_log=False)


if __name__ == "__main__":
    main()
