"""The content-addressed store: one `Store` interface over `local`, `s3`, `http` and `cached` providers."""

from piloop_common.cas.address import hash_bytes, hash_file, hash_stream, parse_address
from piloop_common.cas.base import Blob, Store
from piloop_common.cas.config import CachedCasConfig, CasConfig, HttpCasConfig, LocalCasConfig, S3CasConfig
from piloop_common.cas.factory import open_store

__all__ = [
    "Blob",
    "CachedCasConfig",
    "CasConfig",
    "HttpCasConfig",
    "LocalCasConfig",
    "S3CasConfig",
    "Store",
    "hash_bytes",
    "hash_file",
    "hash_stream",
    "open_store",
    "parse_address",
]
