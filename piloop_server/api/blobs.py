"""The server's CAS on its own API, for callers that act: a remote Python client (`piloop_common.tasks`) puts a
task's arguments and reads its result without a CAS of its own. Workers use their `[plugins.cas]`, not these.

Only what a client needs: put a blob (refused unless the body hashes to its address) and get one (the client
verifies it, as every read does). `piloop cas serve` is the whole CAS, for workers.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import anyio.to_thread
from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse

from piloop_common.cas.address import parse_address
from piloop_common.errors import BadRequest, Corrupt
from piloop_server.api.cas import _Body, _relay
from piloop_server.api.deps import OperatorDep, RuntimeDep, ViewerDep

router = APIRouter(prefix="/v1/cas", tags=["cas"])


@router.get("/blobs/{address}")
def get_blob(address: str, rt: RuntimeDep, caller: ViewerDep, request: Request) -> StreamingResponse:
    opened = rt.store.open(parse_address(address))
    blob = opened.__enter__()  # BlobMissing here, before the response starts
    sent = request.app.state.metrics.cas_bytes.labels("read")
    return StreamingResponse(
        _counted(_relay(opened, blob), sent.inc),
        media_type="application/octet-stream",
        headers={"content-length": str(blob.size)},
    )


def _counted(chunks: Iterator[bytes], add: Callable[[int], None]) -> Iterator[bytes]:
    for chunk in chunks:
        add(len(chunk))
        yield chunk


@router.put("/blobs/{address}", status_code=201)
async def put_blob(address: str, request: Request, rt: RuntimeDep, caller: OperatorDep) -> dict[str, str]:
    address = parse_address(address)
    body = _Body(request.stream())
    try:
        await anyio.to_thread.run_sync(rt.store.put_stream, body, address)
    except Corrupt as e:
        raise BadRequest(f"the body does not hash to {address}: {e.message}", address=address) from e
    request.app.state.metrics.cas_bytes.labels("written").inc(body.size)
    return {"address": address}
