"""embeddb client SDK (installed as ``embeddb.client``). The gRPC client arrives with the server."""
__all__: list[str] = []
