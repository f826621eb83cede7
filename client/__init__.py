"""embeddb client SDK, installed as ``embeddb.client``.

The gRPC client arrives with the server milestone.
"""

__all__: list[str] = []
