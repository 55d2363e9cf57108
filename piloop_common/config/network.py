"""`[plugins.network]`: where the daemon listens beside its socket, its TLS files, and a proxy's rules."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from piloop_common.config.model import ConfigModel


class TlsFiles(ConfigModel):
    cert: str = Field(description="The certificate chain, PEM.")
    key: str = Field(description="The private key, PEM.")


class ProxyRule(ConfigModel):
    when: dict[str, str] = Field(description="Claims and the values they must have.")
    access: Literal["worker", "act"] = Field(description="What a caller this rule matches may do.")
    caller: Literal["human", "service"] = Field("human", description="How its writes are signed.")
    role: Literal["viewer", "operator", "admin"] = Field(
        "admin", description='An `act` caller\'s role (docs/security.md, "Access control"); a `worker` rule has none.'
    )


class NetworkConfig(ConfigModel):
    provider: Literal["token", "proxy"] = Field(
        "token", description="`token`: piloop's own tokens; `proxy`: a proxy's claims."
    )
    listen: str | None = Field(None, description="HOST:PORT to listen on beside the unix socket.")
    url: str | None = Field(None, description="The address workers and provisioned workers dial.")
    tls: Literal["proxy"] | TlsFiles | None = Field(
        None, description='`{cert, key}`, or `"proxy"` when a proxy ends TLS.'
    )
    claims: dict[str, str] = Field(
        default_factory=dict, description="Claim names and the headers a proxy stamps them in."
    )
    name_claims: list[str] = Field(
        default_factory=list, description="The claims that name a caller, first non-empty wins."
    )
    rules: list[ProxyRule] = Field(default_factory=list, description="Access by claims; the first match wins.")
    max_body_mb: int = Field(16, gt=0, description="The largest request body the API accepts (the CAS streams apart).")
    cas_max_put_mb: int = Field(
        4096,
        gt=0,
        description="The largest blob `piloop cas serve` takes in one put, in MiB; "
        "a bigger one is refused (413, naming this key) and nothing is stored.",
    )
    cas_operators: list[str] = Field(
        default_factory=list,
        description="Names of the tokens that may list and delete blobs on `piloop cas serve` (the garbage "
        "collector's: the daemon's `[plugins.cas] token` when its CAS is `http`); any other token only reads and "
        "writes.",
    )
    metrics_listen: str = Field(
        "127.0.0.1:9464",
        description="HOST:PORT where the daemon serves `/metrics` without a token (docs/metrics.md); empty: not "
        "served apart (the main listener's `/metrics` still answers a viewer or above).",
    )
    api_docs: Literal["token", "off"] = Field(
        "token",
        description="`/docs` and `/openapi.json`: `token` answers a viewer or above (the socket, a role token, "
        "an `act` caller) only; `off`: not served (404).",
    )

    @model_validator(mode="after")
    def _metrics_listen(self) -> NetworkConfig:
        host, _, port = self.metrics_listen.rpartition(":")
        if self.metrics_listen and not (host and port.isdigit() and 0 < int(port) < 65536):
            raise ValueError(
                f'metrics_listen = {self.metrics_listen!r}: give HOST:PORT, like 127.0.0.1:9464, or "" for none'
            )
        return self
