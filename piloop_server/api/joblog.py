"""A job's log, chunk by chunk, from the server's CAS: what `piloop attach` reads, from any machine that
reaches the API (the chunks are addresses on the job; the bytes need not be in a CAS the caller can open)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from fastapi import APIRouter
from fastapi.responses import StreamingResponse

from piloop_common.cas.base import Blob
from piloop_common.errors import NotFound
from piloop_server import jobs
from piloop_server.api.deps import RuntimeDep, ViewerDep

router = APIRouter(prefix="/v1/jobs", tags=["jobs"])
ADDRESS_HEADER = "x-piloop-address"


@router.get("/{job_id}/log/{n}")
def log_chunk(job_id: str, n: int, rt: RuntimeDep, caller: ViewerDep) -> StreamingResponse:
    """Chunk `n` (from 0) of the job's log, as stored; its address in `x-piloop-address`."""
    chunks = jobs.view(rt, job_id).log
    if not 0 <= n < len(chunks):
        raise NotFound(f"job {job_id} has {len(chunks)} log chunk(s) so far: no chunk {n}", chunks=len(chunks))
    address = chunks[n]
    opened = rt.store.open(address)
    blob = opened.__enter__()  # a missing blob fails here, before the response starts
    return StreamingResponse(
        _relay(opened, blob),
        media_type="application/octet-stream",
        headers={"content-length": str(blob.size), ADDRESS_HEADER: address},
    )


def _relay(opened: Any, blob: Blob) -> Iterator[bytes]:
    try:
        yield from blob.chunks
    finally:
        opened.__exit__(None, None, None)
