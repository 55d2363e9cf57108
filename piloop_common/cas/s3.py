"""The `s3` provider: blobs as `<prefix>blobs/<hex>` in an S3-compatible bucket, through boto3.

Uploads go through `upload_file` from a file on disk (the caller's, or a spool of a stream):
s3transfer reads each part from the file as it sends it, whereas `upload_fileobj` copies every
part into memory first, so a 256 MiB blob would cost up to `max_concurrency` parts of RAM.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from piloop_common.cas import identity
from piloop_common.cas.address import CHUNK, hex_of
from piloop_common.cas.base import Blob, Listed, Store
from piloop_common.errors import BlobMissing, ConfigError, PiloopError, StoreError, Unauthorized, Unavailable

if TYPE_CHECKING:
    from piloop_common.cas.config import S3CasConfig

HEAD_THREADS = 16
# With `multipart_mb` 8, boto3's own defaults. On moto, a 256 MiB upload in 64 MiB parts, 4 at a time, cost
# the server ~4.0 s of CPU against ~3.1 s in 8 MiB parts, 10 at a time (docs/cas.md). upload_file reads each
# part from the file as it sends it, not into memory: a 256 MiB put and get grew the process by 30 MiB
# (9 MiB with 4 threads; the bound is 64).
UPLOAD_THREADS = 10
LIST_MIN = 8  # below this many addresses, HEADs are as cheap as a page of listing
LIST_RATIO = 20  # at most one page of listing per this many addresses
DELETE_BATCH = 1000  # DeleteObjects takes at most this many keys a call
COPY_MAX = 5 * 2**30  # CopyObject's largest source; a bigger one is copied in parts
REPUT_ATTEMPTS = 3  # a put refused (exists) whose refresh then finds it gone (collected meanwhile) is tried again
_MISSING = {"404", "NoSuchKey", "NotFound"}
_DENIED = {"403", "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "Forbidden"}
_PRECONDITION = {"412", "PreconditionFailed", "409", "ConditionalRequestConflict"}


class S3Store(Store):
    def __init__(self, cfg: S3CasConfig) -> None:
        # boto3 costs a few hundred ms to import: only a store that uses it pays.
        import boto3
        from boto3.s3.transfer import TransferConfig
        from botocore.config import Config

        self.bucket = cfg.bucket
        self.prefix = cfg.prefix
        self.endpoint = cfg.endpoint_url or "AWS S3"
        self.where = f"s3://{cfg.bucket}/{cfg.prefix} at {self.endpoint}"
        session = boto3.session.Session(
            aws_access_key_id=cfg.access_key_id.get_secret_value() if cfg.access_key_id else None,
            aws_secret_access_key=cfg.secret_access_key.get_secret_value() if cfg.secret_access_key else None,
            region_name=cfg.region,
        )
        self._client = session.client(
            "s3",
            endpoint_url=cfg.endpoint_url,
            region_name=session.region_name or "us-east-1",
            config=Config(
                # A few quick retries, then Unavailable: the caller (a worker's spool) retries later.
                retries={"max_attempts": 3, "mode": "standard"},
                connect_timeout=5,
                read_timeout=60,
                max_pool_connections=HEAD_THREADS + 4,
                # Path style works on MinIO and moto as well as AWS; virtual hosts need DNS per bucket.
                s3={"addressing_style": "path"} if cfg.endpoint_url else {},
            ),
        )
        part = cfg.multipart_mb << 20
        self._transfer = TransferConfig(
            multipart_threshold=part, multipart_chunksize=part, max_concurrency=UPLOAD_THREADS
        )

    def key_of(self, address: str) -> str:
        return f"{self.prefix}blobs/{hex_of(address)}"

    def close(self) -> None:
        self._client.close()

    # -- primitives -------------------------------------------------------------------------

    def _store(self, address: str, path: Path, owned: bool) -> None:
        key = self.key_of(address)
        size = path.stat().st_size
        if size < self._transfer.multipart_threshold:
            # One conditional request: If-None-Match skips what exists without a HEAD first. A blob that exists gets
            # one more, which restarts its grace (a collection between a re-put and the submit must not take it).
            for _ in range(REPUT_ATTEMPTS):
                try:
                    with self._errors("upload", address), open(path, "rb") as body:
                        self._client.put_object(Bucket=self.bucket, Key=key, Body=body, IfNoneMatch="*")
                    return
                except _Precondition:
                    if self._refresh(address, size):
                        return  # else a collection removed it between the two requests: put it again
            raise StoreError(f"cannot upload blob {address} to {self.where}: it kept vanishing", address=address)
        # The copy stands in for a HEAD: one request either way, and an existing blob's grace restarts.
        if self._refresh(address, size):
            return
        with self._errors("upload", address):
            self._client.upload_file(str(path), self.bucket, key, Config=self._transfer)

    def _refresh(self, address: str, size: int | None = None) -> bool:
        """Whether the blob is there, its `LastModified` restarted by a copy onto itself (S3 refuses a self-copy
        that changes nothing: `REPLACE` is the change). Over 5 GiB a copy must go in parts (`copy`, many requests)."""
        key = self.key_of(address)
        source = {"Bucket": self.bucket, "Key": key}
        try:
            with self._errors("refresh", address):
                if size is None or size <= COPY_MAX:
                    # a checksum of its own: the one a multipart upload left does not match the copy's whole body
                    self._client.copy_object(
                        Bucket=self.bucket,
                        Key=key,
                        CopySource=source,
                        MetadataDirective="REPLACE",
                        ChecksumAlgorithm="CRC32",
                    )
                elif self._exists(address):
                    self._client.copy(source, self.bucket, key, Config=self._transfer)
                else:
                    return False
        except BlobMissing:
            return False
        except StoreError as e:
            if size is None and "larger than the maximum" in str(e):
                return self._refresh(address, self._size(address))
            raise
        return True

    def _touch(self, addresses: list[str]) -> set[str]:
        if len(addresses) == 1:
            return set(addresses) if self._refresh(addresses[0]) else set()
        with ThreadPoolExecutor(HEAD_THREADS) as pool:
            return {a for a, ok in zip(addresses, pool.map(self._refresh, addresses), strict=True) if ok}

    @contextmanager
    def _open(self, address: str) -> Iterator[Blob]:
        with self._errors("download", address):
            answer = self._client.get_object(Bucket=self.bucket, Key=self.key_of(address))
        body = answer["Body"]
        try:
            yield Blob(int(answer["ContentLength"]), self._chunks(body, address))
        finally:
            body.close()

    def _chunks(self, body: Any, address: str) -> Iterator[bytes]:
        with self._errors("download", address):
            yield from body.iter_chunks(CHUNK)

    def _has_many(self, addresses: list[str]) -> set[str]:
        found, rest = self._listed(addresses) if len(addresses) >= LIST_MIN else (set(), addresses)
        if len(rest) == 1:
            return found | ({rest[0]} if self._exists(rest[0]) else set())
        with ThreadPoolExecutor(HEAD_THREADS) as pool:
            return found | {a for a, ok in zip(rest, pool.map(self._exists, rest), strict=True) if ok}

    def _listed(self, addresses: list[str]) -> tuple[set[str], list[str]]:
        """Answer from a listing of the bucket, within a budget of pages; the rest need HEADs.

        One page answers up to 1,000 keys, so a small store answers a big batch in a few calls.
        A big store spends at most 1/LIST_RATIO of the HEADs on pages, and whatever the pages
        covered (keys come sorted) is still answered.
        """
        wanted = {self.key_of(a): a for a in addresses}
        found: set[str] = set()
        args: dict[str, Any] = {"Bucket": self.bucket, "Prefix": f"{self.prefix}blobs/"}
        last = ""
        for _ in range(max(1, len(addresses) // LIST_RATIO)):
            with self._errors("list blobs"):
                page = self._client.list_objects_v2(**args)
            for obj in page.get("Contents", []):
                last = obj["Key"]
                if last in wanted:
                    found.add(wanted[last])
            if not page.get("IsTruncated"):
                return found, []
            args["ContinuationToken"] = page["NextContinuationToken"]
        return found, [a for k, a in wanted.items() if k > last]

    def _list(self, after: str | None) -> Iterator[Listed]:
        """Pages of 1,000 keys; a key under `blobs/` that is no address (someone else's object) is skipped."""
        blobs = f"{self.prefix}blobs/"
        args: dict[str, Any] = {"Bucket": self.bucket, "Prefix": blobs}
        if after is not None:
            args["StartAfter"] = self.key_of(after)
        while True:
            with self._errors("list blobs"):
                page = self._client.list_objects_v2(**args)
            for obj in page.get("Contents", []):
                name = obj["Key"][len(blobs) :]
                if len(name) == 64 and all(c in "0123456789abcdef" for c in name):
                    yield Listed(f"sha256:{name}", int(obj["Size"]), obj["LastModified"].timestamp())
            if not page.get("IsTruncated"):
                return
            args["ContinuationToken"] = page["NextContinuationToken"]
            args.pop("StartAfter", None)

    def _delete(self, addresses: list[str], before: float) -> list[str]:
        """DeleteObjects, 1,000 keys a call. S3 has no delete conditional on age: `before` was the listing's."""
        removed: list[str] = []
        for i in range(0, len(addresses), DELETE_BATCH):
            batch = addresses[i : i + DELETE_BATCH]
            with self._errors("delete blobs"):
                answer = self._client.delete_objects(
                    Bucket=self.bucket, Delete={"Objects": [{"Key": self.key_of(a)} for a in batch], "Quiet": True}
                )
            failed = {e["Key"]: e for e in answer.get("Errors", [])}
            removed += [a for a in batch if self.key_of(a) not in failed]
            if failed:
                key, error = next(iter(failed.items()))
                raise StoreError(
                    f"S3 at {self.endpoint} refused to delete {len(failed)} of {len(batch)} blobs, "
                    f"e.g. {key}: {error.get('Code')} {error.get('Message')}"
                )
        return removed

    def _size(self, address: str) -> int:
        with self._errors("size", address):
            return int(self._client.head_object(Bucket=self.bucket, Key=self.key_of(address))["ContentLength"])

    def _exists(self, address: str) -> bool:
        try:
            self._size(address)
        except BlobMissing:
            return False
        return True

    def identity(self) -> str:
        key = f"{self.prefix}{identity.NAME}"
        try:
            data = self._get(key)
        except BlobMissing:
            try:
                # If-None-Match makes the create atomic: of two racing starts, the second is refused
                # and reads the first's id.
                with self._errors("create the identity object"):
                    self._client.put_object(Bucket=self.bucket, Key=key, Body=identity.new_document(), IfNoneMatch="*")
            except _Precondition:
                pass
            data = self._get(key)
        return identity.id_from(data, self.where)

    def _get(self, key: str) -> bytes:
        with self._errors(f"read {key}", key):
            body: bytes = self._client.get_object(Bucket=self.bucket, Key=key)["Body"].read()
            return body

    # -- errors -----------------------------------------------------------------------------

    @contextmanager
    def _errors(self, action: str, address: str | None = None) -> Iterator[None]:
        """Turn botocore's exceptions into piloop's, each naming the endpoint and what to check."""
        from boto3.exceptions import S3UploadFailedError
        from botocore.exceptions import (
            BotoCoreError,
            ClientError,
            ConnectionError,
            HTTPClientError,
            NoCredentialsError,
            PartialCredentialsError,
        )

        try:
            yield
        except PiloopError:
            raise
        except (NoCredentialsError, PartialCredentialsError) as e:
            raise ConfigError(
                f"no credentials for {self.where}: set access_key_id and secret_access_key in "
                f"[plugins.cas], or AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY ({e})"
            ) from e
        except (ConnectionError, HTTPClientError) as e:
            raise self._unavailable(action, e) from e
        except ClientError as e:
            raise self._client_error(action, address, e) from e
        except S3UploadFailedError as e:
            cause = e.__context__
            if isinstance(cause, ClientError):
                raise self._client_error(action, address, cause) from e
            if isinstance(cause, (ConnectionError, HTTPClientError)):
                raise self._unavailable(action, cause) from e
            raise StoreError(f"cannot {action} to {self.where}: {e}", address=address) from e
        except BotoCoreError as e:
            raise StoreError(f"cannot {action} at {self.where}: {e}", address=address) from e

    def _unavailable(self, action: str, e: Exception) -> Unavailable:
        return Unavailable(
            f"cannot reach S3 at {self.endpoint} to {action} (bucket {self.bucket}): {e}; "
            f"check endpoint_url in [plugins.cas], the network, and that the service is up",
            endpoint=self.endpoint,
        )

    def _client_error(self, action: str, address: str | None, e: Any) -> PiloopError:
        error = e.response.get("Error", {})
        code = str(error.get("Code", ""))
        status = int(e.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0))
        if code in _PRECONDITION or status == 412:
            return _Precondition(str(e))
        if code in _MISSING:
            return BlobMissing(f"blob {address} is not in {self.where}", address=address)
        if code == "NoSuchBucket":
            return StoreError(f"the bucket {self.bucket} does not exist at {self.endpoint}; create it first")
        if code in _DENIED or status == 403:
            return Unauthorized(
                f"S3 at {self.endpoint} refused to {action} in {self.bucket} ({code}); "
                f"check the credentials and the bucket's policy"
            )
        if status >= 500 or code in ("SlowDown", "ServiceUnavailable"):
            return self._unavailable(action, e)
        return StoreError(f"S3 at {self.endpoint} refused to {action}: {e}", address=address)


class _Precondition(StoreError):
    """A conditional put found the object already there."""
