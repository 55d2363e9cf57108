"""piloop's worker: heartbeats, claims and reports over the API; each job under a self-fencing shim."""

__all__ = ["run_worker"]


def __getattr__(name: str) -> object:
    # not imported at the top: the shim host imports this package, and what it holds each task's fork copies
    if name == "run_worker":
        from piloop_worker.main import run_worker

        return run_worker
    raise AttributeError(f"module 'piloop_worker' has no attribute {name!r}")
