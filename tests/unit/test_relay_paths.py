"""The relay's allowlist (piloop_worker/relaypath.py) against the server's relay routers, and how it reads paths."""

from __future__ import annotations

import re

import pytest

from piloop_server.api import nested, relay
from piloop_worker.relaypath import ROUTES, NotARoute, route


def _server_routes() -> set[tuple[str, str]]:
    out = set()
    for r in (*relay.router.routes, *nested.router.routes):
        for method in r.methods:  # type: ignore[attr-defined]
            out.add((method, r.path))  # type: ignore[attr-defined]
    return out


def test_the_allowlist_is_the_servers_relay_routes():
    server = _server_routes()
    # each server route, its parameters filled in with a plain value, is forwarded as is
    for method, path in server:
        example = re.sub(r"\{[a-z_]+\}", "j0123abc", path.replace("{n}", "3"))
        assert route(method, example) == example, (method, path)
    # and each allowlist entry is one of them
    assert len(ROUTES) == len(server)


NORMALISED = [
    ("/v1/relay/job", "/v1/relay/job"),
    ("/v1/relay//job", "/v1/relay/job"),
    ("/v1/relay/./job", "/v1/relay/job"),
    ("/v1/relay/x/../job", "/v1/relay/job"),
    ("/v1/relay/x/%2e%2e/job", "/v1/relay/job"),
    ("/v1/relay\\job", "/v1/relay/job"),
    ("/v1%2frelay%2Fjob", "/v1/relay/job"),
]


@pytest.mark.parametrize("target,path", NORMALISED)
def test_a_path_is_normalised_before_it_is_matched(target, path):
    assert route("GET", target) == path


REFUSED = [
    "/v1/relay/../worker/claim",
    "/v1/relay/%2e%2e/worker/claim",
    "/v1/relay/%2E%2E/worker/claim",
    "/v1/relay/.%2e/worker/claim",
    "/v1/relay/..%2fworker%2fclaim",
    "/v1/relay/..\\worker\\claim",
    "/v1/relay/..%5cworker/claim",
    "/v1/relay/%252e%252e/worker/claim",
    "/v1/relay/job/../../worker/claim",
    "//v1/relay/../../v1/worker/claim",
    "/v1/relay/..;/worker/claim",
    "/v1/relay/%c0%ae%c0%ae/worker/claim",
    "/v1/relay/%00/../../worker/claim",
    "http://127.0.0.1/v1/relay/job",
    "/v1/relay/jobs/..",
    "/v1/relay/jobs/%2e%2e/cancel",
    "/v1/relay/blobs/a/b",
]


@pytest.mark.parametrize("target", REFUSED)
def test_anything_else_is_refused(target):
    with pytest.raises(NotARoute) as e:
        route("POST", target)
    assert "\n" not in str(e.value)


def test_the_method_counts():
    with pytest.raises(NotARoute):
        route("POST", "/v1/relay/job")
    with pytest.raises(NotARoute):
        route("GET", "/v1/relay/submit")
