"""`[plugins.cas]` models: one per provider, unknown keys refused, secrets kept secret."""

from __future__ import annotations

import pytest
from pydantic import TypeAdapter, ValidationError

from piloop_common.cas.config import CachedCasConfig, CasConfig, HttpCasConfig, LocalCasConfig, S3CasConfig

CONFIG = TypeAdapter(CasConfig)


def test_each_provider_is_chosen_by_its_name() -> None:
    assert isinstance(CONFIG.validate_python({"provider": "local"}), LocalCasConfig)
    assert isinstance(CONFIG.validate_python({"provider": "s3", "bucket": "b"}), S3CasConfig)
    assert isinstance(CONFIG.validate_python({"provider": "http", "url": "https://x:7701"}), HttpCasConfig)
    cached = CONFIG.validate_python(
        {"provider": "cached", "local_max_gb": 50, "remote": {"provider": "http", "url": "u"}}
    )
    assert isinstance(cached, CachedCasConfig) and isinstance(cached.remote, HttpCasConfig)


@pytest.mark.parametrize(
    "raw",
    [
        {"provider": "local", "pth": "/x"},
        {"provider": "s3", "bucket": "b", "secret_key": "k"},
        {"provider": "http", "url": "u", "tokn": "t"},
        {"provider": "cached", "remote": {"provider": "s3", "bucket": "b", "regoin": "eu"}},
        {"provider": "cached", "remote": {"provider": "cached", "remote": {"provider": "local"}}},
        {"provider": "ftp"},
        {"provider": "s3"},
        {"provider": "s3", "bucket": "b", "multipart_mb": 1},
    ],
)
def test_unknown_keys_and_bad_values_are_refused(raw: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        CONFIG.validate_python(raw)


def test_credentials_never_print() -> None:
    cfg = CONFIG.validate_python(
        {"provider": "s3", "bucket": "b", "access_key_id": "AKIA1", "secret_access_key": "s3cr3t"}
    )
    assert "s3cr3t" not in repr(cfg) and "AKIA1" not in str(cfg)
    assert cfg.secret_access_key.get_secret_value() == "s3cr3t"


def test_every_key_is_described() -> None:
    for model in (LocalCasConfig, S3CasConfig, HttpCasConfig, CachedCasConfig):
        for name, info in model.model_fields.items():
            assert info.description, f"{model.__name__}.{name}"
