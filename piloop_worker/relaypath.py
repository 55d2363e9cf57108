"""What a job's relay forwards: the server's relay routes, named by the normalised path and nothing else.

The job writes the request line, so its path is the attacker's: `/v1/relay/../worker/claim` passes a prefix check
and then becomes `/v1/worker/claim` in the HTTP client, which would call a worker route with the worker's own
credential. So the path is decoded once (`%2e`, `%2f`, `%5c`), its backslashes read as slashes, its dot segments
and empty segments removed, and only then matched, whole, against `ROUTES`; what is forwarded is that canonical
path, which has nothing left for a client or a server to normalise. Anything else is refused unforwarded.
"""

from __future__ import annotations

import re
from urllib.parse import unquote

# One path segment a relay route takes (a job id, a blob's address, a log chunk's number): it starts with a letter or
# digit, so it is never `.` or `..`, and holds no `/`, `%` or `\`. The server checks each value itself.
_SEG = r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}"
# The server's /v1/relay routes (piloop_server/api/relay.py and api/nested.py); tests/unit/test_relay_paths.py holds
# this list to the server's routers.
ROUTES: tuple[tuple[str, re.Pattern[str]], ...] = tuple(
    (method, re.compile(pattern))
    for method, pattern in (
        ("GET", "/v1/relay/job"),
        ("POST", "/v1/relay/progress"),
        ("POST", "/v1/relay/submit"),
        ("POST", "/v1/relay/jobs"),
        ("GET", f"/v1/relay/jobs/{_SEG}"),
        ("POST", f"/v1/relay/jobs/{_SEG}/cancel"),
        ("GET", f"/v1/relay/jobs/{_SEG}/log/[0-9]{{1,9}}"),
        ("GET", f"/v1/relay/blobs/{_SEG}"),
        ("POST", f"/v1/relay/blobs/{_SEG}"),
    )
)
SHOWN = "GET /v1/relay/job, POST /v1/relay/progress|submit|jobs, /v1/relay/jobs/ID[/cancel|/log/N], /v1/relay/blobs/A"
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


class NotARoute(Exception):
    """A path the relay does not forward: its message says why, in one line."""


def normalise(target: str) -> str:
    """The path `target` names once decoded and its dot segments resolved, or NotARoute when it cannot be read."""
    if not target.startswith("/"):
        raise NotARoute("a relayed call's target is a path (/v1/relay/…), not a URL")
    try:
        path = unquote(target, errors="strict")
    except UnicodeDecodeError:
        raise NotARoute("its path decodes to no UTF-8") from None
    if "%" in path:  # encoded twice (`%252e`): a server that decodes again would see what this check did not
        raise NotARoute("its path is percent-encoded twice")
    if _CONTROL.search(path):
        raise NotARoute("its path holds a control character")
    out: list[str] = []
    for seg in path.replace("\\", "/").split("/"):
        if seg in ("", "."):
            continue
        if seg == "..":
            if out:
                out.pop()
            continue
        out.append(seg)
    return "/" + "/".join(out)


def route(method: str, target: str) -> str:
    """The canonical path to forward for a job's `method target`, or NotARoute when it names no relay route."""
    path = normalise(target)
    if any(m == method and p.fullmatch(path) for m, p in ROUTES):
        return path
    raise NotARoute(f"{method} {path[:120]!r} is not one of the relay's routes")
