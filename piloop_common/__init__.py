"""piloop: leases on Redis, one content-addressed store, workers on any machine."""

__version__ = "0.1.0"
