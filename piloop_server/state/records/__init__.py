"""The records Redis stores, one typed class each, whose field names are written once (in their module)."""

from piloop_server.state.records.limit import Limit as Limit
from piloop_server.state.records.token import Token as Token
