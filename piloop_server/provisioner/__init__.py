"""Workers that the server starts: one small interface per platform, and the pool logic of the pass."""

from piloop_server.provisioner.base import Handle, PlatformAuthError, Provider, StartRefused
from piloop_server.provisioner.manager import Provisioner
from piloop_server.provisioner.providers import open_provider

__all__ = ["Handle", "PlatformAuthError", "Provider", "Provisioner", "StartRefused", "open_provider"]
