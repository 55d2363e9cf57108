"""`/metrics`: the daemon's Prometheus metrics (docs/metrics.md)."""

from piloop_server.metrics.instruments import Metrics

__all__ = ["Metrics"]
