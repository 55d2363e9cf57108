"""A no-op task for the rq and Celery sides of the benchmarks."""


def noop() -> None:
    return None
