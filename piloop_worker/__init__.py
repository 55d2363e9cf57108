"""piloop's worker: heartbeats, claims and reports over the API; each job under a self-fencing shim."""

from piloop_worker.main import run_worker

__all__ = ["run_worker"]
