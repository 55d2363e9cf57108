"""Why a pool's queued job waits, derived from its workers' "no lease" facts (piloop_server/pools.py), and the
capacity a newcomer gets: the `serve` pool's evaluation slots are the host's CPUs, `max_load` holds nothing back."""

from __future__ import annotations

import os

from piloop_common.config.settings import ExecutorConfig, PoolConfig
from piloop_common.protocol.operator import WorkerView
from piloop_common.protocol.worker import HostSample
from piloop_server import pools


def _facts(limits: dict[str, str] | None = None, **cfg: object) -> pools.PoolFacts:
    return pools.PoolFacts("serve", PoolConfig(**cfg), limits or {}, 40.0)  # type: ignore[arg-type]


def _worker(
    name: str = "serve", load1: float = 0.5, free_gb: float = 8, evaluations: int = 0, **kw: object
) -> WorkerView:
    sample = HostSample(
        cpus=2, load1=load1, memory_available_gb=free_gb, disk_free_gb=10, memory_pressure=kw.pop("psi", None)
    )
    return WorkerView(name=name, pool="serve", sample=sample, evaluations=evaluations, **{"reachable": True, **kw})  # type: ignore[arg-type]


def test_a_worker_over_max_load_names_its_load_and_the_limit_that_set_it():
    got = pools.waiting(
        _facts({"executor.pools.serve.max_load": "busy"}, max_load=2.0), "evaluation", [_worker(load1=10.8)]
    )
    assert got == pools.Waiting("load", "worker serve's load 10.8/2 (5.4 per CPU) is over max_load 2 (a limit: busy)")


def test_memory_slots_pressure_and_no_worker_each_say_so():
    facts = _facts(evaluations=1, min_memory_gb=1)
    assert pools.waiting(facts, "evaluation", [_worker(free_gb=0.25)]) == pools.Waiting(
        "memory", "worker serve's free memory 0.2 GB is under min_memory_gb 1"
    )
    assert pools.waiting(facts, "evaluation", [_worker(psi=55.0)]) == pools.Waiting(
        "memory", "worker serve's memory pressure 55% is over memory_pressure_max 40%"
    )
    assert pools.waiting(facts, "evaluation", [_worker(evaluations=1)]) == pools.Waiting(
        "slots", "worker serve's 1 evaluation slot is full"
    )
    assert pools.waiting(facts, "evaluation", []) == pools.Waiting("no_worker", "no live worker in pool serve")
    gone = _worker(reachable=False)
    assert pools.waiting(facts, "evaluation", [gone]) == pools.Waiting("unreachable", "worker serve is unreachable")
    assert pools.waiting(_facts(evaluations=0), "evaluation", [_worker()]) == pools.Waiting(
        "slots", "pool serve has 0 evaluation slots: evaluations = 0"
    )


def test_one_worker_that_may_take_it_means_it_does_not_wait():
    facts = _facts(evaluations=2, max_load=2.0)
    assert pools.waiting(facts, "evaluation", [_worker("a", load1=9), _worker("b", evaluations=1)]) is None
    both = pools.waiting(facts, "evaluation", [_worker("a", load1=9), _worker("b", evaluations=2)])
    assert both is not None and both.code == "load"
    assert both.text == "worker a's load 9.0/2 (4.5 per CPU) is over max_load 2; worker b's 2 evaluation slots are full"


def test_max_load_holds_nothing_back_by_default():
    assert PoolConfig().max_load is None
    assert pools.host_reason(PoolConfig(), HostSample(cpus=2, load1=14.0, memory_available_gb=8, disk_free_gb=1)) == ""


def test_the_serve_pool_has_as_many_evaluation_slots_as_the_host_has_cpus():
    cpus = max(2, len(os.sched_getaffinity(0)))
    assert ExecutorConfig().pools["serve"].evaluations == cpus
    given = ExecutorConfig.model_validate({"pools": {"serve": {"agents": 1}, "gpu": {}}})
    assert given.pools["serve"].evaluations == cpus and given.pools["gpu"].evaluations == 1
    assert ExecutorConfig.model_validate({"pools": {"serve": {"evaluations": 1}}}).pools["serve"].evaluations == 1
