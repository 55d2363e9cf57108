def test_an_unknown_route_answers_piloops_own_404(daemon):
    from piloop_common.errors import NotFound

    with daemon.api() as api:
        try:
            api.call("GET", "/v1/nope")
        except NotFound as e:
            assert e.message == "no route GET /v1/nope"
        else:
            raise AssertionError("GET /v1/nope answered")
