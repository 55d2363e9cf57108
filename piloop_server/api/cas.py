"""The CAS routes: `/v1/cas/...`, serving any `Store` with streamed bodies both ways.

Uploads are refused (400) unless the body hashes to the address in the path; downloads are
relayed as stored, and the client verifies them (every read verifies, at the reader). `sweep_router` is the
garbage collector's side (list, delete), for operators only.
"""

from __future__ import annotations

import io
import itertools
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import anyio
import anyio.from_thread
import anyio.to_thread
from fastapi import APIRouter, Depends, Query, Request, Response
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, Field

from piloop_common.cas.address import parse_address
from piloop_common.cas.base import Blob, Store
from piloop_common.errors import BadRequest, Corrupt

MAX_HAS = 100_000
MAX_SWEEP = 1000  # blobs a listing page or a delete call carries


class ListedView(BaseModel):
    address: str
    size: int
    modified: float  # epoch seconds of the blob's last write


class ListAnswer(BaseModel):
    blobs: list[ListedView]
    more: bool  # ask again after the last address


class DeleteRequest(BaseModel):
    addresses: list[str] = Field(max_length=MAX_SWEEP)
    before: float  # epoch seconds: a blob written since is kept, where the store can tell


class DeleteAnswer(BaseModel):
    removed: list[str]


class HasRequest(BaseModel):
    addresses: list[str] = Field(max_length=MAX_HAS)
    touch: bool = False  # restart the grace of those present, as a put would (a client skipping an upload)


class HasAnswer(BaseModel):
    present: list[str]


def cas_router(store: Callable[[], Store], auth: Callable[..., Any]) -> APIRouter:
    """The routes over the store that `store()` returns; every route depends on `auth`."""
    router = APIRouter(prefix="/v1/cas", dependencies=[Depends(auth)])

    @router.get("/identity")
    def identity() -> dict[str, str]:
        return {"id": store().identity()}

    @router.post("/has")
    def has(body: HasRequest) -> HasAnswer:
        ask = store().touch_many if body.touch else store().has_many
        return HasAnswer(present=sorted(ask(body.addresses)))

    @router.head("/blobs/{address}")
    def head(address: str) -> Response:
        size = store().size(address)
        return Response(headers={"content-length": str(size)})

    @router.get("/blobs/{address}")
    def get(address: str) -> StreamingResponse:
        opened = store().open(address)
        blob = opened.__enter__()  # BlobMissing here, before the response starts
        return StreamingResponse(
            _relay(opened, blob), media_type="application/octet-stream", headers={"content-length": str(blob.size)}
        )

    @router.put("/blobs/{address}", status_code=201)
    async def put(address: str, request: Request) -> dict[str, str]:
        address = parse_address(address)
        body = _Body(request.stream())
        try:
            await anyio.to_thread.run_sync(store().put_stream, body, address)
        except Corrupt as e:
            raise BadRequest(f"the body does not hash to {address}: {e.message}", address=address) from e
        return {"address": address}

    return router


def sweep_router(store: Callable[[], Store], auth: Callable[..., Any]) -> APIRouter:
    """The garbage collector's routes (list every blob, delete some); `auth` must let only operators in."""
    router = APIRouter(prefix="/v1/cas", dependencies=[Depends(auth)])

    @router.get("/list")
    def listing(after: str | None = None, limit: int = Query(MAX_SWEEP, ge=1, le=MAX_SWEEP)) -> ListAnswer:
        page = list(itertools.islice(store().blobs(after), limit + 1))
        views = [ListedView(address=b.address, size=b.size, modified=b.modified) for b in page[:limit]]
        return ListAnswer(blobs=views, more=len(page) > limit)

    @router.post("/delete")
    def delete(body: DeleteRequest) -> DeleteAnswer:
        return DeleteAnswer(removed=store().delete_blobs(body.addresses, body.before))

    return router


def _relay(opened: Any, blob: Blob) -> Iterator[bytes]:
    try:
        yield from blob.chunks
    finally:
        opened.__exit__(None, None, None)


class _Body(io.RawIOBase):
    """The request body as a blocking file, for the store's put running in a worker thread.

    Each read hops to the event loop for the next chunk, so the body streams into the
    store's spool and is never held whole.
    """

    def __init__(self, chunks: AsyncIterator[bytes]) -> None:
        self._chunks = chunks
        self._buffer = b""
        self._done = False
        self.size = 0  # bytes read so far

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        while not self._buffer and not self._done:
            chunk = anyio.from_thread.run(self._next)
            if chunk is None:
                self._done = True
            else:
                self._buffer = chunk
        if size < 0:
            size = len(self._buffer)
        out, self._buffer = self._buffer[:size], self._buffer[size:]
        self.size += len(out)
        return out

    async def _next(self) -> bytes | None:
        try:
            return await self._chunks.__anext__()
        except StopAsyncIteration:
            return None
