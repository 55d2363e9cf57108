"""Workers that the server starts: one small interface per platform, and the pool logic of the pass."""

from piloop_server.provisioner.base import Handle, PlatformAuthError, Provider, StartRefused, open_provider
from piloop_server.provisioner.manager import Provisioner

__all__ = ["Handle", "PlatformAuthError", "Provider", "Provisioner", "StartRefused", "open_provider"]
