"""The `[plugins.cas]` config models: one per provider, chosen by `provider`; unknown keys are refused."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr


class LocalCasConfig(BaseModel):
    """Blobs in a directory on this machine."""

    model_config = ConfigDict(extra="forbid")

    provider: Literal["local"] = Field("local", description="A directory on this machine.")
    path: str | None = Field(
        None, description="The store's directory; relative to `$PILOOP_HOME`. Default: `$PILOOP_HOME/cas`."
    )


class S3CasConfig(BaseModel):
    """Blobs in an S3-compatible bucket (AWS, MinIO, R2), as `<prefix>blobs/<hex>`."""

    model_config = ConfigDict(extra="forbid")

    provider: Literal["s3"] = Field(description="An S3-compatible bucket.")
    bucket: str = Field(min_length=1, description="The bucket's name; it must exist.")
    prefix: str = Field("", description="Prepended to every key, e.g. `piloop/`; lets stores share a bucket.")
    endpoint_url: str | None = Field(
        None, description="The S3 endpoint, e.g. `http://minio:9000`; default: AWS's for `region`."
    )
    region: str | None = Field(None, description="The bucket's region; default: boto3's (`AWS_DEFAULT_REGION`).")
    access_key_id: SecretStr | None = Field(
        None, description="Access key id; default: boto3's chain (`AWS_ACCESS_KEY_ID`, profiles, roles)."
    )
    secret_access_key: SecretStr | None = Field(
        None, description="Secret access key; given together with `access_key_id`."
    )
    multipart_mb: int = Field(
        8,
        ge=5,
        description="Blobs larger than this many MiB upload in parts of this size, 10 at a time "
        "(S3's minimum is 5; boto3's default is 8).",
    )


class HttpCasConfig(BaseModel):
    """The CAS of a piloop server, served by `piloop cas serve`."""

    model_config = ConfigDict(extra="forbid")

    provider: Literal["http"] = Field(description="A `piloop cas serve` endpoint.")
    url: str = Field(min_length=1, description="The server's URL, e.g. `https://piloop.example.com:7701`.")
    token: SecretStr | None = Field(None, description="The bearer token; default: `PILOOP_HTTPS_TOKEN`.")
    timeout_seconds: float = Field(30, gt=0, description="Connect and read timeout of each request, in seconds.")


RemoteCasConfig = Annotated[LocalCasConfig | S3CasConfig | HttpCasConfig, Field(discriminator="provider")]


class CachedCasConfig(BaseModel):
    """A local LRU cache in front of another store; writes go through to it."""

    model_config = ConfigDict(extra="forbid")

    provider: Literal["cached"] = Field(description="A local cache in front of `remote`.")
    local_max_gb: float = Field(10, gt=0, description="The cache's size limit, in GB (10^9 bytes).")
    path: str | None = Field(
        None, description="The cache's directory; relative to `$PILOOP_HOME`. Default: `$PILOOP_HOME/cas-cache`."
    )
    remote: RemoteCasConfig = Field(description="The store behind the cache: a `local`, `s3` or `http` table.")


CasConfig = Annotated[LocalCasConfig | S3CasConfig | HttpCasConfig | CachedCasConfig, Field(discriminator="provider")]
