"""What every worker call is checked for at the door, before it reaches the lease engine: its protocol, its pool and
CAS, the name its token may hold (`owner`, the identity a name and its leases are bound to), and the sizes and counts
it chooses ([plugins.state] caps)."""

from __future__ import annotations

import json

from piloop_common.errors import Refused, TooLarge
from piloop_common.protocol.report import LogAppend, ReportRequest, ReportsRequest
from piloop_common.protocol.worker import PROTOCOL, ClaimRequest, RegisterRequest, ReleaseRequest, WorkerHello
from piloop_server.auth import Caller
from piloop_server.runtime import Runtime
from piloop_server.state.records.worker import WorkerRecord


def check(
    rt: Runtime,
    caller: Caller,
    hello: WorkerHello | ClaimRequest | ReleaseRequest | ReportRequest | ReportsRequest | LogAppend,
) -> None:
    if hello.protocol != PROTOCOL:
        raise Refused(
            f"the server speaks piloop protocol {PROTOCOL}, this worker {hello.protocol}: "
            "install the same piloop version on both"
        )
    if not isinstance(hello, WorkerHello):
        return
    if hello.pool not in rt.executor.pools:
        raise Refused(f"unknown pool {hello.pool}; the server's pools: {', '.join(sorted(rt.executor.pools))}")
    if caller.token is not None and caller.token.pool and caller.token.pool != hello.pool:
        raise Refused(f"token {caller.name} is for pool {caller.token.pool}, not {hello.pool}")
    if hello.cas_id != rt.cas_id:
        raise Refused(
            f"the worker's CAS ({hello.cas_id}) is not the server's ({rt.cas_id}): "
            "give the worker the server's [plugins.cas]"
        )


def owner(caller: Caller) -> str:
    """The identity a worker's name is bound to (register.lua) and its leases with it (include/lease_check.lua): the
    token's name (a name is unique, and only an admin makes a token), else how the caller came."""
    if caller.token is not None:
        return f"token:{caller.token.name}"
    return "socket" if caller.via_socket else "proxy"


def own_name(rt: Runtime, caller: Caller) -> None:
    """Refused when a `--rename` token names its worker after another token: that name is the other token's."""
    tok = caller.token
    if tok is None or caller.name == tok.name:
        return
    other = rt.tokens.get(caller.name)
    if other is not None:
        raise Refused(f"worker name {caller.name} is token {other.name}'s: token {tok.name} chooses another name")


def check_sizes(rt: Runtime, body: RegisterRequest) -> None:
    """TooLarge when the worker's `info` or `image` is over [plugins.state] worker_info_max_bytes."""
    cap = rt.settings.plugins.state.worker_info_max_bytes
    for what, size in (("info", len(json.dumps(body.info))), ("image", len(body.image.encode()))):
        if size > cap:
            raise TooLarge(
                f"the worker's {what} is {size} bytes, over the cap of {cap} ([plugins.state] worker_info_max_bytes)"
            )


def check_want(rt: Runtime, body: ClaimRequest) -> None:
    """TooLarge when a claim asks for more jobs of a kind than [plugins.state] claim_want_max."""
    cap = rt.settings.plugins.state.claim_want_max
    for kind, n in body.want.items():
        if n > cap:
            raise TooLarge(f"want {kind}={n}: over the cap of {cap} ([plugins.state] claim_want_max)")


def check_claimer(caller: Caller, rec: WorkerRecord) -> None:
    """Refused when the caller's token is not the one `rec`'s name is bound to, or is bound to another pool than
    the record names (checked at every claim, not only at register)."""
    if rec.owner and rec.owner != owner(caller):
        raise Refused(f"worker name {rec.name} is held by another token while its record lives")
    if caller.token is not None and caller.token.pool and caller.token.pool != rec.pool:
        raise Refused(f"token {caller.token.name} is for pool {caller.token.pool}, not {rec.pool}")
