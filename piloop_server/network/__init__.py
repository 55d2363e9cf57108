"""How TCP callers are identified: piloop's own tokens (`auth.py`), or a proxy's claims (`proxy.py`)."""

from piloop_server.network.proxy import ProxyIdentity, identify_proxy, match_rule, read_claims

__all__ = ["ProxyIdentity", "identify_proxy", "match_rule", "read_claims"]
