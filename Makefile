# The README's two commands: `make demo` (piloop's main job, end to end, on the embedded
# defaults) and `make test` (every test). Both set up the venv themselves, as does `make bench`.

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
DEMO_HOME ?= $(CURDIR)/.piloop-demo

.PHONY: venv bytecode demo lint test test-redis7 test-debian-python stack-test bench clean

# once per change of pyproject.toml: about a minute, so it says so and pip prints each package it fetches
$(BIN)/.installed: pyproject.toml
	@echo "== setting up $(VENV) (once; about a minute)"
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -e '.[test]'
	touch $@
	@echo "== $(VENV) is ready"

venv: $(BIN)/.installed

# piloop's bytecode, as pip writes it for an installed package: an editable checkout under PYTHONDONTWRITEBYTECODE
# would compile its modules from source in every process it starts (a daemon, a worker, each slot supervisor);
# only what changed since the last run is compiled
bytecode: venv
	$(BIN)/python -m compileall -q piloop_common piloop_server piloop_worker tests bench > /dev/null

demo: venv bytecode
	PATH="$(abspath $(BIN)):$$PATH" PILOOP_HOME="$(DEMO_HOME)" sh bench/demo.sh

# two tests at a time: each starts its own redis-server, daemons and workers, and spends much of its time waiting
# on them (a lease to expire, a fence); two halve the run on 2 CPUs. TEST_JOBS=0 runs them one after another.
TEST_JOBS ?= 2

# the linter, the formatter's check and the type checker (strict on all three packages: [tool.mypy] in pyproject.toml);
# the tests that read the tree's boundaries are in tests/unit/test_tree.py
lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy piloop_common piloop_server piloop_worker

# TEST_ARGS: more pytest arguments, like -m "not stack" where `make stack-test` has run those already
TEST_ARGS ?=
test: lint bytecode
	$(BIN)/pytest -q $(if $(filter 0,$(TEST_JOBS)),,-n $(TEST_JOBS)) $(TEST_ARGS)

# the tests that exercise Redis itself (scripts, expiry, streams, its faults) on Debian's redis-server 7.x beside the
# embedded 6.2 that `make test` uses; .ci/run installs it (apt-get install redis-server)
REDIS7 ?= /usr/bin/redis-server
REDIS7_TESTS := tests/integration/test_redis_version.py tests/integration/test_lease_machine.py \
	tests/integration/test_leases.py tests/integration/test_heartbeats.py tests/integration/test_retention.py \
	tests/integration/test_events_state.py tests/faults/test_redis_faults.py tests/adversarial/test_bounded_writes.py
test-redis7: venv
	PILOOP_TEST_REDIS_SERVER=$(REDIS7) PILOOP_TEST_REDIS_MAJOR=7 $(BIN)/pytest -q -n $(TEST_JOBS) $(REDIS7_TESTS)

# the unit tests and one end-to-end job (shipped task code, unpacked by a worker) on Debian 12's own Python, the
# oldest that requires-python admits here (3.11.2), in a venv of its own beside the newest that `make test` uses:
# what needs a later Python (tarfile's filter= is 3.11.4+) fails here first. A few minutes, most of it the venv
DEBIAN_PYTHON ?= /usr/bin/python3
DEBIAN_VENV ?= .venv-debian
DEBIAN_TESTS := tests/unit \
	tests/integration/test_taskcode.py::test_shipped_code_runs_on_a_worker_elsewhere_and_an_edit_runs_without_a_restart
$(DEBIAN_VENV)/.installed: pyproject.toml
	@echo "== setting up $(DEBIAN_VENV) on $$($(DEBIAN_PYTHON) --version) (once; about a minute)"
	$(DEBIAN_PYTHON) -m venv $(DEBIAN_VENV)
	$(DEBIAN_VENV)/bin/pip install -q --upgrade pip
	$(DEBIAN_VENV)/bin/pip install -q -e '.[test]'
	touch $@
test-debian-python: $(DEBIAN_VENV)/.installed
	$(DEBIAN_VENV)/bin/python --version
	$(DEBIAN_VENV)/bin/pytest -q -n $(TEST_JOBS) $(DEBIAN_TESTS)

# the compose stack and the `docker` provisioner with real containers (tests/stack/, docs/compose.md): Debian's
# docker.io and debootstrap installed when missing (root), dockerd started when none answers, the images built
# (cached: a second run on the machine builds only what changed), the whole within STACK_SECONDS; the two files run
# side by side (--dist loadfile), as neither touches the other's containers
STACK_SECONDS ?= 900
stack-test: venv
	sh tests/stack/setup.sh
	timeout $(STACK_SECONDS) $(BIN)/pytest -q -n 2 --dist loadfile -rs tests/stack

# piloop beside rq and Celery on one Redis, one table (docs/performance.md); BENCH_ARGS=--quick for a one-minute run
bench: venv
	$(BIN)/python -m bench $(BENCH_ARGS)

clean:
	-PILOOP_HOME="$(DEMO_HOME)" $(BIN)/piloop stop
	rm -rf $(VENV) $(DEBIAN_VENV) $(DEMO_HOME)
