"""embeddb hybrid trainer (installed as ``embeddb.trainer``); the only part of embeddb that imports torch."""
__all__: list[str] = []
