"""`piloop status`: the daemon, Redis, the CAS, each pool's slots and jobs, the running agents' last lines, limits
and escalations, in columns (or `--json`)."""

from __future__ import annotations

import sys
import time
from typing import Any

import click

from piloop_common.cli.live import agent_lines
from piloop_common.cli.output import ago, emit_json, table, value_text
from piloop_common.errors import Unavailable


def _mib(n: int) -> str:
    return f"{n / 2**20:,.1f} MiB" if n < 2**30 else f"{n / 2**30:,.2f} GiB"


def _days(seconds: float | None) -> str:
    if not seconds:
        return "kept forever"
    return f"{seconds / 86400:g} d" if seconds >= 86400 else f"{seconds:g} s"


def _gc(gc: dict[str, Any] | None) -> str:
    """When the CAS garbage collection last ran and next runs (`cas_gc_seconds`), as the status line's tail."""
    if gc is None:  # a server from before the collection
        return ""
    now = time.time() * 1000
    last = ago((now - gc["last_ms"]) / 1000) if gc["last_ms"] else "never"
    nxt = gc["next_ms"]
    if nxt is None:
        return f"; garbage collection {last}, none scheduled (cas_gc_seconds = 0)"
    due = "due now" if nxt <= now else "in " + ago((nxt - now) / 1000).removesuffix(" ago")
    return f"; garbage collection {last}, next {due}"


def _backoff(p: dict[str, Any]) -> str:
    if p.get("halted"):
        return f"halted: {p['halted']}"
    if p.get("backoff_left_seconds"):
        return f"{p['backoff_left_seconds']:.0f}s left of {p['backoff_seconds']:g}s: {p['last_failure']}"
    return "-"


def _memory(p: dict[str, Any]) -> str:
    """A pool's granted/room over its reachable workers, in GiB."""
    if not p.get("room_mb"):
        return "-"
    return f"{p.get('granted_mb', 0) / 1024:.1f}/{p['room_mb'] / 1024:.1f} GiB"


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_obj
def status(obj, as_json: bool) -> None:
    """The daemon, Redis, the CAS, each pool's slots and jobs, the running agents' last lines, limits and escalations."""
    try:
        with obj.api() as api:
            st = api.call("GET", "/v1/status")
            live = [] if as_json else agent_lines(api)
    except Unavailable as down:
        if as_json:
            emit_json({"daemon": None})
        elif obj.remote:
            click.echo(f"piloop: {down.message}")
        else:
            click.echo(f"piloop: no daemon answers on {obj.home / 'piloop.sock'} (start it: `piloop serve --detach`)")
        sys.exit(1)
    if as_json:
        emit_json(st)
        return
    d = st["daemon"]
    up = time.time() - d.get("started_ms", 0) / 1000
    click.echo(
        f"daemon   pid {d.get('pid')}, up {ago(up).removesuffix(' ago')}, piloop {d.get('version')}"
        + (f", listening on {d['listen']}" if d.get("listen") else "")
    )
    r = st["redis"]
    click.echo(
        f"redis    {'embedded' if r['embedded'] else 'external'}, generation {r['generation']}, "
        f"namespace {r['namespace']}"
    )
    if r.get("unchecked"):
        click.echo(f"         not checked: {r['unchecked']}")
    if "used_memory" in r:  # a server from before retention says nothing of it
        used, most = r["used_memory"], r["maxmemory"]
        of = f" of maxmemory {_mib(most)} ({used / most:.0%})" if most else " (no maxmemory set)"
        ret = st.get("retention") or {}
        click.echo(
            f"         {_mib(used)} used{of}; {r['retained_jobs']:,} ended jobs kept, pruned every pass "
            f"(finished {_days(ret.get('finished_seconds'))}, failed {_days(ret.get('failed_seconds'))})"
        )
    click.echo(f"cas      {st['cas']['provider']}, id {st['cas']['id']}{_gc(st.get('cas_gc'))}")
    click.echo("")
    rows = [
        [
            p["pool"],
            f"{p['reachable']}/{p['workers']}",
            f"{p['agent_free']}/{p['agent_slots']}",
            f"{p['evaluation_free']}/{p['evaluation_slots']}",
            f"{p['agent_queued']}/{p['agent_running']}",
            f"{p['evaluation_queued']}/{p['evaluation_running']}",
            _memory(p),
        ]
        for p in st["pools"]
    ]
    click.echo(
        table(
            [
                "pool",
                "workers",
                "agents free",
                "evaluations free",
                "agents queued/running",
                "evaluations queued/running",
                "memory granted/room",
            ],
            rows,
        )
    )
    for p in st["pools"]:  # why a pool's queued jobs have no lease
        for kind, why in (p.get("waiting") or {}).items():
            click.echo(f" waiting: pool {p['pool']}'s {kind}s: {why}")
    if st.get("provisioners"):
        click.echo("")
        rows = [
            [p["pool"], p["provider"], p["max"], p["starting"], p["running"], p["draining"], p["stopping"], _backoff(p)]
            for p in st["provisioners"]
        ]
        click.echo(
            table(["provisioned", "provider", "max", "starting", "running", "draining", "stopping", "backoff"], rows)
        )
    if st.get("campaigns"):
        click.echo("")
        rows = [
            [
                c["name"],
                c["state"],
                f"{c['live']}/{c['target']}",
                c["queued"],
                c["runs"],
                ", ".join(f"{b['branch']} {b['score']:g}" for b in c["best"]) or "-",
            ]
            for c in st["campaigns"]
        ]
        click.echo(table(["campaign", "state", "agents live/target", "queued", "runs", "best runs"], rows))
    if live:
        click.echo("")
        click.echo("\n".join(live))
    if st["limits"]:
        click.echo("")
        click.echo("limits")
        for lim in st["limits"]:
            click.echo(f"  {lim['key']} = {value_text(lim['value'])}: {lim['reason']} ({lim['by']})")
    if st["escalations"]:
        click.echo("")
        click.echo("escalations (`piloop inbox`)")
        for e in st["escalations"]:
            click.echo(f"  {e['id']}  {e['what']}: {e['message']}")
