"""The Dockerfile and .dockerignore, checked statically (no Docker engine runs here): two targets, `server` and
`worker`, each non-root with `ENTRYPOINT ["piloop"]` and its extra; Debian's git and no compiler; only PyPI and
Debian's packages fetched. Their `pip install` of the tree runs for real in tests/integration/test_install.py."""

from __future__ import annotations

import json
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
HOME = "/var/lib/piloop"  # the image's PILOOP_HOME: docker-compose.yml mounts the configs under it


def dockerfile() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments), continuation lines joined, comments dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for line in (REPO / "Dockerfile").read_text().splitlines():
        if line.lstrip().startswith("#") or not line.strip():
            continue
        pending += line.rstrip()
        if pending.endswith("\\"):
            pending = pending[:-1] + " "
            continue
        word, _, rest = pending.strip().partition(" ")
        out.append((word.upper(), rest.strip()))
        pending = ""
    return out


def dockerfile_stages() -> list[tuple[str, list[tuple[str, str]]]]:
    """Each target (`FROM … AS name`) with its steps, its parents' included, as `docker build --target` runs them."""
    stages: dict[str, list[tuple[str, str]]] = {}
    order: list[str] = []
    current: list[tuple[str, str]] = []
    for inst, args in dockerfile():
        if inst == "FROM":
            image, _, name = args.partition(" AS ") if " AS " in args else args.partition(" as ")
            current = [*stages.get(image, []), ("FROM", image)]
            stages[name or image] = current
            order.append(name or image)
            continue
        current.append((inst, args))
    return [(n, stages[n]) for n in order]


# a compiler or a build tool in the image: everything must come as wheels
COMPILERS = re.compile(r"\b(gcc|g\+\+|clang|build-essential|make|cmake|cc|python3?-dev|libc6-dev)\b")


def test_dockerfile() -> None:
    steps = dockerfile()
    froms = [a for i, a in steps if i == "FROM"]
    # the base is a build argument (a mirror's image, or one built without a registry), by default the official one
    args = dict(a.split("=", 1) for i, a in steps if i == "ARG" and "=" in a)
    assert froms[0].startswith("${BASE_IMAGE}"), f"FROM {froms[0]}: the base image is the BASE_IMAGE argument"
    m = re.match(r"python:3\.(\d+)(?:\.\d+)?-slim", args.get("BASE_IMAGE", ""))
    assert m and int(m.group(1)) >= 11, f"ARG BASE_IMAGE={args.get('BASE_IMAGE')}: python 3.11+ slim by default"
    stages = dict(dockerfile_stages())
    assert list(stages)[-1] == "server", "`docker build .` (no --target) builds the last stage: make it the server"
    installs = {"worker": "pip install '.[s3]'", "server": "pip install '.[server]'"}
    for target, install in installs.items():
        steps = stages[target]
        users = [a for i, a in steps if i == "USER"]
        assert users, f"{target}: the image must not run as root"
        assert users[-1].split(":")[0] not in ("root", "0"), f"{target}: USER {users[-1]}"
        entry = [a for i, a in steps if i == "ENTRYPOINT"]
        assert entry and json.loads(entry[-1]) == ["piloop"], f'{target}: ENTRYPOINT ["piloop"] in exec form'
        runs = " ".join(a for i, a in steps if i == "RUN")
        assert install in runs, f"{target}: {install}"
        env = " ".join(a for i, a in steps if i == "ENV")
        assert f"PILOOP_HOME={HOME}" in env, "the compose file mounts configs under the image's PILOOP_HOME"
        assert "HEALTHCHECK" not in [i for i, _ in steps], "health checks belong to the compose services"
    assert "[server]" not in " ".join(a for i, a in stages["worker"] if i == "RUN"), "the worker has no server libs"


def test_the_dockerfile_installs_git_and_nothing_it_would_compile_with() -> None:
    """Debian's packages only through apt-get, with no recommends, no compiler, and the lists removed in the same
    layer; nothing fetched from elsewhere (no curl, wget or git clone)."""
    stages = dict(dockerfile_stages())
    for target in ("worker", "server"):
        apt_runs = [a for i, a in stages[target] if i == "RUN" and "apt-get" in a]
        packages = []
        for run in apt_runs:
            for part in run.split("&&"):
                words = part.split()
                if words[:2] == ["apt-get", "install"]:
                    assert "--no-install-recommends" in words and "-y" in words, part
                    packages += [w for w in words[2:] if not w.startswith("-")]
            assert "rm -rf /var/lib/apt/lists/*" in run, f"{target}: the package lists stay in the layer: {run}"
        assert "git" in packages, f"{target}: campaigns need git"
        assert not [p for p in packages if COMPILERS.search(p)], f"{target}: a compiler in {packages}"
        runs = " ".join(a for i, a in stages[target] if i == "RUN")
        assert not re.search(r"\b(curl|wget|git clone)\b", runs), "no fetches beyond PyPI and Debian's packages"


def test_the_dockerfile_rules_see_a_bad_step() -> None:
    assert COMPILERS.search("build-essential") and COMPILERS.search("gcc") and not COMPILERS.search("git")


def test_dockerignore_lets_the_package_in() -> None:
    lines = [x.strip() for x in (REPO / ".dockerignore").read_text().splitlines() if x.strip() and x[0] != "#"]
    if "*" in lines:
        for need in ("pyproject.toml", "README.md", "LICENSE", "piloop_common/", "piloop_server/", "piloop_worker/"):
            assert f"!{need}" in lines, f".dockerignore keeps {need} out of the build"
