"""docs/ cannot drift: the configuration reference is `reference.render()`, every config field has a
description, and every `piloop …` command the operator docs show resolves against the real CLI."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import click
import pytest

from piloop_common.cli import root
from piloop_common.config import reference
from piloop_server.state import stateref

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"
# the docs this issue owns; each `piloop …` line in their code blocks must be a real command
COMMAND_DOCS = ["quickstart.md", "operations.md", "architecture.md"]


def test_configuration_md_is_render() -> None:
    want = reference.render()
    got = (DOCS / "configuration.md").read_text()
    assert got == want, (
        "docs/configuration.md differs from the models: run "
        "`python -m piloop_server.docgen > docs/configuration.md` and commit it"
    )


def test_every_config_field_has_a_description() -> None:
    assert reference.missing_descriptions() == []


def test_every_key_of_the_models_is_in_the_reference() -> None:
    from piloop_common.cas.config import CachedCasConfig, HttpCasConfig, LocalCasConfig, S3CasConfig
    from piloop_common.config.network import NetworkConfig, ProxyRule, TlsFiles
    from piloop_common.config.provisioner import LocalCompute, ModalCompute, ProvisionerConfig, RegistryConfig
    from piloop_common.config.settings import ExecutorConfig, PoolConfig, StateConfig

    text = reference.render()
    for model in (
        ExecutorConfig,
        PoolConfig,
        ProvisionerConfig,
        LocalCompute,
        ModalCompute,
        RegistryConfig,
        NetworkConfig,
        TlsFiles,
        ProxyRule,
        StateConfig,
        LocalCasConfig,
        S3CasConfig,
        HttpCasConfig,
        CachedCasConfig,
    ):
        for name in model.model_fields:
            assert f"| `{name}` |" in text, f"{model.__name__}.{name} is not in the reference"


def _code_lines(path: Path) -> list[str]:
    """Each command line of the ```bash blocks, continuation lines joined, comments dropped."""
    lines: list[str] = []
    in_block = False
    pending = ""
    for raw in path.read_text().splitlines():
        if raw.startswith("```"):
            in_block = raw.strip() in ("```bash", "```sh", "```console") if not in_block else False
            continue
        if not in_block:
            continue
        line = pending + raw.strip()
        if line.endswith("\\"):
            pending = line[:-1] + " "
            continue
        pending = ""
        if line and not line.startswith("#"):
            lines.append(line)
    return lines


def _piloop_argvs(line: str) -> list[list[str]]:
    """The argv of every `piloop` call on one shell line (after env assignments, `&&`, `|`, `&`, `$(`)."""
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    lexer.commenters = "#"
    try:
        tokens = list(lexer)
    except ValueError:
        return []
    segments: list[list[str]] = [[]]
    for tok in tokens:
        if tok and set(tok) <= set("();<>|&"):
            segments.append([])
        else:
            segments[-1].append(tok)
    out = []
    for words in segments:
        while words and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", words[0]):
            words = words[1:]
        if words[:3] == ["docker", "compose", "exec"]:
            words = [w for w in words[3:] if w != "-T"][1:]  # drop the service name
        if words and words[0] == "piloop":
            out.append(words[1:])
    return out


def resolve(argv: list[str]) -> click.Command:
    """Parse argv against the click tree without running anything; raise on an unknown command or flag."""
    ctx = root.make_context("piloop", list(argv))
    cmd: click.Command = root
    args = _rest(ctx)
    while isinstance(cmd, click.Group) and args:
        name, sub, args = cmd.resolve_command(ctx, args)
        if sub is None:
            break
        ctx = sub.make_context(name, args, parent=ctx)
        cmd = sub
        args = _rest(ctx) if isinstance(sub, click.Group) else []
    return cmd


def _rest(ctx: click.Context) -> list[str]:
    # click 8.2+ keeps a group's subcommand apart (its public `protected_args` is deprecated); click 9 folds it
    # into `args`
    return [*(ctx.__dict__.get("_protected_args") or []), *ctx.args]


@pytest.mark.parametrize("doc", COMMAND_DOCS)
def test_doc_commands_are_real(doc: str) -> None:
    path = DOCS / doc
    assert path.exists(), f"docs/{doc} is missing"
    seen = 0
    for line in _code_lines(path):
        for argv in _piloop_argvs(line):
            if "--help" in argv or "-h" in argv:
                continue
            try:
                resolve(argv)
            except click.ClickException as e:
                pytest.fail(f"docs/{doc}: `piloop {' '.join(argv)}` does not parse: {e.format_message()}")
            seen += 1
    assert doc == "architecture.md" or seen, f"docs/{doc} shows no piloop command"


def test_architecture_state_block_is_generated() -> None:
    text = (DOCS / "architecture.md").read_text()
    assert stateref.STATE_BEGIN in text and stateref.STATE_END in text
    assert stateref.splice_state(text) == text, (
        "docs/architecture.md's Redis keys or Lua scripts differ from piloop_server/state/: run "
        "`python -m piloop_server.docgen --write` and commit it"
    )


def test_architecture_names_only_real_modules() -> None:
    text = (DOCS / "architecture.md").read_text()
    text = text[: text.index(stateref.STATE_BEGIN)]
    files = [
        str(p.relative_to(REPO))
        for pkg in ("piloop_common", "piloop_server", "piloop_worker")
        for p in (REPO / pkg).rglob("*")
        if "__pycache__" not in p.parts
    ]
    for name in sorted(set(re.findall(r"`([\w/]+(?:\.py|\.lua|/))`", text))):
        name = name.replace("*", "")
        hit = [f for f in files if f == name.rstrip("/") or f.endswith("/" + name.rstrip("/"))]
        assert hit, f"docs/architecture.md names `{name}`, which is not in the tree"
