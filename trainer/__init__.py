"""embeddb hybrid trainer, installed as ``embeddb.trainer``.

The only part of embeddb that imports torch; it arrives with the training milestone.
"""

__all__: list[str] = []
