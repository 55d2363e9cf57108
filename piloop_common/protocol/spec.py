"""A job's spec (`JobSpec`): what a job runs and how, with its checks (env names, input names, inline inputs,
timings, a chain's pipe), and a campaign job's repo and workspace (`CampaignJob`)."""

from __future__ import annotations

import base64
import binascii
from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from piloop_common.bytecaps import INLINE_MAX_BYTES
from piloop_common.exceptionnames import CLASSES_MOST, EXCEPTION_NAME
from piloop_common.protocol.message import JobId, Message

COUNTDOWN_MOST = 366 * 86400  # the longest countdown or expiry: a year
JOB_ENV_RESERVED = ("LD_", "DYLD_", "PILOOP_")  # a job's env may not set these (JobSpec._names)
TIMEOUT_MOST = 366 * 86400  # the longest timeout a job may have: a year
MEMORY_MOST_MB = 1024**3  # the largest grant a job may ask for: 1 PiB, in MiB
# dependencies: the most parents one job waits on, and a chain's input before the parent's result fills it in
AFTER_MOST = 64
PIPE_PLACEHOLDER = "sha256:" + "0" * 64
PIPE_INPUTS = ("parent.json", "parent.pickle")
INLINE_PREFIX = "inline:"  # a chain's input filled with its parent's inline result (include/dependencies.lua)


class JobSpec(Message):
    runner: Literal["process", "task"] = Field(
        "process",
        description=(
            "process: exec argv; task: argv[0] is `module:function`, run in a process forked from the worker's warm "
            "interpreter (`piloop_common.tasks`), its arguments the input args.json or args.pickle"
        ),
    )
    argv: list[str] = Field(min_length=1)
    env: dict[str, str] = Field(
        default_factory=dict,
        description="Variables the job gets: a name is letters, digits and _, not starting with a digit, and none "
        "beginning LD_, DYLD_ or PILOOP_ (the loader's and piloop's own).",
    )
    secrets: list[str] = Field(default_factory=list, description="Names of the secrets the job gets as env.")
    inputs: dict[str, str] = Field(default_factory=dict, description="File name -> CAS address, put in the job's dir.")
    inline_inputs: dict[str, str] = Field(
        default_factory=dict,
        description=(
            "File name -> its bytes, base64: small inputs (a task's arguments) carried in the spec, and so in the "
            "claim's answer, put in the job's dir like `inputs` without the CAS; at most 64 KiB in all, decoded "
            "(`piloop_common.bytecaps.INLINE_MAX_BYTES`), and no name of `inputs`."
        ),
    )
    code: str | None = Field(
        None,
        pattern=r"^sha256:[0-9a-f]{64}$",
        description=(
            "The CAS address of a code snapshot (`piloop_common.sdk.taskcode`): the worker unpacks it once per address and "
            "puts it first on the job's PYTHONPATH, so a task imports its module from it."
        ),
    )
    timeout_seconds: float | None = Field(None, gt=0, le=TIMEOUT_MOST)
    memory_mb: int | None = Field(
        None,
        gt=0,
        le=MEMORY_MOST_MB,
        description=(
            "The job's memory grant (MiB): its cgroup limit, and what a worker must have room for to take it; "
            "unset: the pool's `memory_mb`, else no grant (limited to the worker's room)."
        ),
    )
    memory_growth: float = Field(
        1.5,
        ge=1,
        le=10,
        description=(
            "After an attempt runs out of memory, the next one is granted this many times as much (1: never raise)."
        ),
    )
    memory_max_mb: int | None = Field(
        None,
        gt=0,
        le=MEMORY_MOST_MB,
        description=(
            "The most a raised grant may reach (MiB); unset: the pool's `memory_max_mb`, else the room of the worker "
            "where the attempt ran out."
        ),
    )
    max_attempts: int = Field(
        1,
        ge=1,
        le=100,
        description=(
            "Attempts that may fail (exit code, signal, timeout, out of memory) before the job ends `failed`; a lost "
            "or fenced run is not an attempt, and an out-of-memory attempt whose grant can still grow does not count."
        ),
    )
    backoff_seconds: float = Field(10, ge=0, le=86400, description="The wait before a failed job's next attempt.")
    backoff_factor: float = Field(
        2, ge=1, le=10, description=("Each further failed attempt waits this many times longer (at most an hour).")
    )
    campaign: CampaignJob | None = Field(None, description="Set by the server for a campaign's agents and evaluations.")
    # timing and priority
    retry_on: list[Annotated[str, Field(pattern=EXCEPTION_NAME)]] = Field(
        default_factory=list,
        max_length=CLASSES_MOST,
        description=(
            "Tasks: the qualified names of the exception classes whose failure is retried (`builtins.OSError`; a "
            "subclass of one counts); empty: every failed attempt is, while attempts are left."
        ),
    )
    priority: int = Field(
        0,
        ge=0,
        le=9,
        description="0 to 9, 9 first: claims take a higher one first within a pool and kind; FIFO within one.",
    )
    countdown_seconds: float | None = Field(
        None,
        ge=0,
        le=COUNTDOWN_MOST,
        description="Not claimable until this long after it is queued (Redis's clock): it waits in `delayed`, queued.",
    )
    expires_seconds: float | None = Field(
        None,
        gt=0,
        le=COUNTDOWN_MOST,
        description="Not started (leased) within this long of being queued: it never runs and ends `expired`.",
    )

    @model_validator(mode="before")
    @classmethod
    def _piped_inline(cls, data: Any) -> Any:
        # a chain's input whose parent's result was inline: the server put it in place of the placeholder as
        # `inline:<base64>` (include/dependencies.lua); it is an inline input
        inputs = data.get("inputs") if isinstance(data, dict) else None
        if isinstance(inputs, dict) and any(
            isinstance(v, str) and v.startswith(INLINE_PREFIX) for v in inputs.values()
        ):
            inline = dict(data.get("inline_inputs") or {})
            for name, v in list(inputs.items()):
                if isinstance(v, str) and v.startswith(INLINE_PREFIX):
                    inline[name] = v.removeprefix(INLINE_PREFIX)
            kept = {n: v for n, v in inputs.items() if n not in inline}
            data = {**data, "inputs": kept, "inline_inputs": inline}
        return data

    @model_validator(mode="after")
    def _timing(self) -> JobSpec:
        if self.expires_seconds is not None and self.expires_seconds <= (self.countdown_seconds or 0):
            raise ValueError(
                f"expires_seconds ({self.expires_seconds:g}) is not after countdown_seconds "
                f"({self.countdown_seconds or 0:g}): the job would expire before it may start"
            )
        return self

    # dependencies
    after: list[JobId] = Field(
        default_factory=list,
        max_length=AFTER_MOST,
        description=(
            "Parent jobs: this one waits (`waiting`) until every one has succeeded, and ends `cancelled` naming the "
            "first that failed, was cancelled, lost or expired."
        ),
    )
    pipe: JobId | None = Field(
        None,
        description=(
            "A chain's parent (one of `after`): its task result becomes this task's first argument, the input "
            "`parent.<serializer>` whose address the server fills in once the parent has succeeded."
        ),
    )

    @model_validator(mode="after")
    def _pipe_is_a_parent(self) -> JobSpec:
        piped = [name for name in PIPE_INPUTS if name in self.inputs or name in self.inline_inputs]
        if self.pipe is not None and (self.pipe not in self.after or len(piped) != 1):
            raise ValueError(f"pipe {self.pipe}: a chain's parent is one of `after`, its input parent.json or .pickle")
        if self.pipe is None and PIPE_PLACEHOLDER in self.inputs.values():
            raise ValueError("an input's address is a chain's placeholder, and the job has no `pipe`")
        return self

    @model_validator(mode="after")
    def _names(self) -> JobSpec:
        from piloop_common import envnames

        for name in self.env:
            if not envnames.NAME.fullmatch(name):
                raise ValueError(
                    f"env name {name[:80]!r}: letters, digits and _, not starting with a digit, at most 128"
                )
            if name.upper().startswith(JOB_ENV_RESERVED):
                raise ValueError(
                    f"env name {name!r}: names beginning {', '.join(JOB_ENV_RESERVED)} (in any case) are refused: the "
                    "dynamic loader's and piloop's own (the worker sets PILOOP_* for the job's lease and relay)"
                )
        for name in self.inputs:
            if why := input_problem(name):
                raise ValueError(f"input name {name[:80]!r}: {why}")
        if self.inline_inputs:
            check_inline(self.inline_inputs, self.inputs)
        return self

    @model_validator(mode="after")
    def _memory_cap(self) -> JobSpec:
        if self.memory_mb and self.memory_max_mb and self.memory_max_mb < self.memory_mb:
            raise ValueError(
                f"memory_max_mb ({self.memory_max_mb}) is below memory_mb ({self.memory_mb}): "
                "the cap on a raised grant cannot be under the first grant"
            )
        return self


def check_inline(inline: dict[str, str], named: dict[str, str], what: str = "input") -> None:
    """Refuse inline files (name -> base64) that are over INLINE_MAX_BYTES in all, not base64, or also in `named`
    (the same files' CAS addresses)."""
    total = 0
    for name, data in inline.items():
        if why := input_problem(name):
            raise ValueError(f"inline {what} name {name[:80]!r}: {why}")
        if name in named:
            raise ValueError(f"{what} {name!r} is both inline and a CAS address: give one")
        try:
            total += len(base64.b64decode(data, validate=True))
        except (binascii.Error, ValueError):
            raise ValueError(f"inline {what} {name!r}: not base64") from None
    if total > INLINE_MAX_BYTES:
        raise ValueError(
            f"inline {what}s of {total} bytes, over {INLINE_MAX_BYTES} (bytecaps.INLINE_MAX_BYTES): put them in the "
            "CAS and name their addresses"
        )


_LEAVES = frozenset(("", ".", ".."))  # a part of an input's name that would leave inputs/ (or name no file)


def input_problem(name: str) -> str:
    """Why `name` cannot be an input's file name, one that stays inside the job's `inputs/` ('' when it can)."""
    parts = name.split("/")
    if not name or len(name) > 255 or name.startswith("/") or "\\" in name:
        return "a relative path under inputs/, at most 255 characters, with / between its parts"
    if not _LEAVES.isdisjoint(parts):
        return "no empty, `.` or `..` part: it must stay inside inputs/"
    return ""


class RepoSpec(Message):
    """A campaign job's repo: the worker's clone starts from the campaign's bundle, then fetches what is newer."""

    campaign: str
    bundle: str = Field(description="CAS address of the campaign's whole-repo bundle, built once.")
    commit: str = Field(pattern=r"^[0-9a-f]{40}$", description="The commit the job starts at (checked out).")
    branch: str = Field("", description="Agents: the branch their commits go on, `runs/<job>`.")


class CampaignJob(Message):
    """What a campaign job brings and takes back, beside its process spec."""

    repo: RepoSpec
    workspace: str | None = Field(None, description="Agents: CAS address of the workspace manifest they get a copy of.")
    collect: bool = Field(
        False, description="Agents: bring back new commits (a bundle from `commit`) and workspace writes."
    )
    score: bool = Field(False, description="Evaluations: take the score from the last line of the output.")
