"""The limits' policy (piloop_server/limits.py), without Redis: which keys a limit may name, how values are typed,
and what `Limits.apply` leaves out."""

from __future__ import annotations

import pytest

from piloop_common.config.provisioner import ProvisionerConfig
from piloop_common.config.settings import ExecutorConfig, PoolConfig
from piloop_common.errors import BadRequest
from piloop_server.limits import TIMING_KEYS, Limits, leaf, typed
from piloop_server.state.records.limit import Limit

EX = ExecutorConfig(pools={"serve": PoolConfig(), "gpu": PoolConfig(provisioner=ProvisionerConfig(max=2))})


def value(key: str, raw: object) -> object:
    return typed(leaf(EX.model_dump(), key), key, raw)


@pytest.mark.parametrize(
    "key,raw,want",
    [
        ("executor.pools.serve.evaluations", "2", 2),
        ("executor.pools.serve.evaluations", 0, 0),
        ("executor.pools.gpu.max_load", "2", 2.0),
        ("executor.pools.gpu.max_load", "1.5", 1.5),
        ("executor.pools.gpu.memory_mb", "null", None),
        ("executor.pools.gpu.runners", '["process"]', ["process"]),
        ("executor.pools.gpu.provisioner.max", "0", 0),
        ("executor.pools.gpu.provisioner.compute.hang", "true", True),
        ("executor.pools.gpu.provisioner.compute.env", '{"A": "b"}', {"A": "b"}),
        ("executor.memory_pressure_max", "50", 50.0),
    ],
)
def test_a_value_that_fits_its_field_is_taken(key, raw, want):
    got = value(key, raw)
    assert got == want and type(got) is type(want)


@pytest.mark.parametrize(
    "key,raw,why",
    [
        ("executor.pools.serve.evaluations", "true", "valid integer"),
        ("executor.pools.serve.evaluations", True, "valid integer"),
        ("executor.pools.serve.evaluations", "-1", "greater than or equal to 0"),
        ("executor.pools.serve.evaluations", "1.5", "valid integer"),
        ("executor.pools.serve.evaluations", "two", "valid integer"),
        ("executor.pools.serve.evaluations", '"2"', "valid integer"),
        ("executor.pools.gpu.max_load", "false", "valid number"),
        ("executor.pools.gpu.max_load", "0", "greater than 0"),
        ("executor.pools.gpu.max_load", "Infinity", "valid number"),
        ("executor.pools.gpu.max_load", "NaN", "valid number"),
        ("executor.memory_pressure_max", "500", "less than or equal to 100"),
        ("executor.pools.gpu.provisioner.compute.hang", "1", "valid boolean"),
        ("executor.pools.gpu.provisioner.compute.env", '{"A": 1}', "valid string"),
        ("executor.pools.gpu.runners", "process", "valid list"),
    ],
)
def test_a_value_of_another_type_or_out_of_range_is_refused_naming_the_key(key, raw, why):
    with pytest.raises(BadRequest) as e:
        value(key, raw)
    assert e.value.message.startswith(f"{key} = ") and why in e.value.message


@pytest.mark.parametrize(
    "key,why",
    [
        ("executor.pools.serve.nope", "no such key; executor.pools.serve has agents, evaluations"),
        ("executor.nope", "no such key; executor has"),
        ("executor.pools.nope.evaluations", "executor.pools has no nope (gpu, serve)"),
        ("executor.pools.serve", "is a table"),
        ("executor.pools", "is a table"),
        ("executor.pools.gpu.provisioner", "is a table"),
        ("executor.pools.serve.provisioner.max", "not set in config.toml"),
        ("executor.pools.serve.evaluations.x", "is a value, not a table"),
        ("executor.pools.gpu.provisioner.compute.image", "no such key"),  # local compute has none
        ("pools.serve.evaluations", "limits set keys of [plugins.executor]"),
        ("executor", "limits set keys of [plugins.executor]"),
    ],
)
def test_a_key_the_schema_does_not_have_is_refused_naming_it(key, why):
    with pytest.raises(BadRequest) as e:
        leaf(EX.model_dump(), key)
    assert e.value.message.startswith(f"{key}: ") and why in e.value.message


@pytest.mark.parametrize("name", sorted(TIMING_KEYS))
def test_a_timing_is_no_limit(name):
    with pytest.raises(BadRequest) as e:
        leaf(EX.model_dump(), f"executor.{name}")
    msg = e.value.message
    assert msg.startswith(f"executor.{name}: ") and f"edit {name} in config.toml" in msg and "restart" in msg


def test_every_timing_field_of_the_executor_is_a_timing_key():
    # a new `*_seconds` key of the executor must be decided: a timing (config.toml only) or a limit
    seconds = {n for n in ExecutorConfig.model_fields if n.endswith("_seconds")}
    assert seconds <= TIMING_KEYS and "max_lost" in TIMING_KEYS


def test_apply_leaves_out_a_stored_timing_and_a_stored_value_of_the_wrong_type():
    stored = {
        "executor.toleration_seconds": Limit(400, "r", "human:x", 1),
        "executor.pools.serve.evaluations": Limit(True, "r", "human:x", 1),  # from before values were typed
        "executor.pools.serve.agents": Limit(3, "r", "human:x", 1),
    }
    got, bad = Limits.apply(EX, stored)
    assert bad == ["executor.pools.serve.evaluations", "executor.toleration_seconds"]
    assert got.toleration_seconds == EX.toleration_seconds
    assert got.pools["serve"].evaluations == EX.pools["serve"].evaluations
    assert got.pools["serve"].agents == 3


def test_apply_leaves_out_a_limit_whose_pool_left_config_toml():
    stored = {
        "executor.pools.old.evaluations": Limit(0, "r", "h", 1),
        "executor.pools.gpu.evaluations": Limit(0, "r", "h", 1),
    }
    got, bad = Limits.apply(EX, stored)
    assert bad == ["executor.pools.old.evaluations"] and "old" not in got.pools and got.pools["gpu"].evaluations == 0
