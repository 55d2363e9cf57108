"""The `http` provider: the CAS of a piloop server (`piloop cas serve`), through httpx.

Every call here is idempotent (a blob's address is its content), so connect failures are
retried a few times with backoff before the caller sees `Unavailable`.
"""

from __future__ import annotations

import os
import ssl
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from piloop_common.cas.address import CHUNK
from piloop_common.cas.base import Blob, Listed, Store
from piloop_common.errors import BlobMissing, PiloopError, StoreError, Unauthorized, Unavailable, from_payload

ATTEMPTS = 4
BACKOFF_SECONDS = 0.25  # doubled after each failed attempt: 0.25, 0.5, 1.0
HAS_BATCH = 10_000
LIST_PAGE = 1000  # blobs a listing page and a delete call carry (as S3's)


class HttpStore(Store):
    def __init__(self, url: str, token: str | None = None, timeout: float = 30) -> None:
        self.url = url.rstrip("/")
        self.where = self.url
        self._has_token = bool(token)
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._client = httpx.Client(base_url=self.url, headers=headers, timeout=timeout, verify=_verify())
        self._id: str | None = None

    def close(self) -> None:
        self._client.close()

    def _store(self, address: str, path: Path, owned: bool) -> None:
        # What the server has is not sent again, but its grace restarts there as a put's would.
        if self._touch([address]):
            return
        self._send("PUT", _blob(address), body=path).close()

    @contextmanager
    def _open(self, address: str) -> Iterator[Blob]:
        response = self._send("GET", _blob(address), stream=True)
        try:
            yield Blob(int(response.headers.get("content-length", -1)), self._chunks(response))
        finally:
            response.close()

    def _chunks(self, response: httpx.Response) -> Iterator[bytes]:
        try:
            yield from response.iter_bytes(CHUNK)
        except httpx.TransportError as e:
            raise self._unavailable("read a blob", e) from e

    def _has_many(self, addresses: list[str]) -> set[str]:
        present: set[str] = set()
        for i in range(0, len(addresses), HAS_BATCH):
            answer = self._send("POST", "/v1/cas/has", json={"addresses": addresses[i : i + HAS_BATCH]})
            present.update(answer.json()["present"])
        return present

    def _touch(self, addresses: list[str]) -> set[str]:
        present: set[str] = set()
        for i in range(0, len(addresses), HAS_BATCH):
            body = {"addresses": addresses[i : i + HAS_BATCH], "touch": True}
            present.update(self._send("POST", "/v1/cas/has", json=body).json()["present"])
        return present

    def _size(self, address: str) -> int:
        return int(self._send("HEAD", _blob(address)).headers["content-length"])

    def _list(self, after: str | None) -> Iterator[Listed]:
        while True:
            params: dict[str, Any] = {"limit": LIST_PAGE, **({"after": after} if after else {})}
            page = self._send("GET", "/v1/cas/list", params=params).json()
            for b in page["blobs"]:
                yield Listed(str(b["address"]), int(b["size"]), float(b["modified"]))
                after = str(b["address"])
            if not page["more"] or not page["blobs"]:
                return

    def _delete(self, addresses: list[str], before: float) -> list[str]:
        removed: list[str] = []
        for i in range(0, len(addresses), LIST_PAGE):
            body = {"addresses": addresses[i : i + LIST_PAGE], "before": before}
            removed += self._send("POST", "/v1/cas/delete", json=body).json()["removed"]
        return removed

    def identity(self) -> str:
        if self._id is None:
            self._id = str(self._send("GET", "/v1/cas/identity").json()["id"])
        return self._id

    # -- transport --------------------------------------------------------------------------

    def _send(
        self, method: str, path: str, *, body: Path | None = None, stream: bool = False, **kwargs: Any
    ) -> httpx.Response:
        """One call, retried on connect failures; an error answer raises the error it names."""
        for attempt in range(ATTEMPTS):
            try:
                if body is not None:
                    with open(body, "rb") as f:
                        # httpx reads a file object in chunks: the body streams from disk.
                        headers = {"content-length": str(os.fstat(f.fileno()).st_size)}
                        response = self._client.request(method, path, content=f, headers=headers, **kwargs)
                else:
                    request = self._client.build_request(method, path, **kwargs)
                    response = self._client.send(request, stream=stream)
            except (httpx.ConnectError, httpx.ConnectTimeout) as e:
                if attempt + 1 == ATTEMPTS:
                    raise self._unavailable(f"{method} {path}", e) from e
                time.sleep(BACKOFF_SECONDS * 2**attempt)
                continue
            except httpx.TransportError as e:
                raise self._unavailable(f"{method} {path}", e) from e
            if response.status_code >= 400:
                self._raise_for(response, method, path)
            return response
        raise AssertionError("unreachable")

    def _raise_for(self, response: httpx.Response, method: str, path: str) -> None:
        status = response.status_code
        try:
            response.read()
            payload = response.json() if response.content else None
        except (ValueError, httpx.HTTPError):
            payload = None
        finally:
            response.close()
        if status == 401:
            what = "refused the token" if self._has_token else "needs a token"
            raise Unauthorized(
                f"the CAS at {self.url} {what} ({method} {path}); set `token` in [plugins.cas] "
                f"or PILOOP_HTTPS_TOKEN to a live token"
            )
        if isinstance(payload, dict) and "error" in payload:
            raise from_payload(payload, status)
        if status == 404 and path.startswith("/v1/cas/blobs/"):
            address = path.rsplit("/", 1)[-1]
            raise BlobMissing(f"blob {address} is not in {self.url}", address=address)
        if status >= 500:
            raise Unavailable(f"the CAS at {self.url} answered {status} to {method} {path}", endpoint=self.url)
        raise StoreError(f"the CAS at {self.url} answered {status} to {method} {path}")

    def _unavailable(self, action: str, e: Exception) -> PiloopError:
        return Unavailable(
            f"cannot reach the CAS at {self.url} ({action}): {e or type(e).__name__}; check the url in "
            f"[plugins.cas], that `piloop cas serve` runs there, and the network",
            endpoint=self.url,
        )


def _blob(address: str) -> str:
    return f"/v1/cas/blobs/{address}"


def _verify() -> ssl.SSLContext | bool:
    """Trust `SSL_CERT_FILE` when set (a private CA), else the default bundle."""
    cafile = os.environ.get("SSL_CERT_FILE")
    return ssl.create_default_context(cafile=cafile) if cafile else True
