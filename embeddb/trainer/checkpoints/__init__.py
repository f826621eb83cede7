"""Job checkpoints: :mod:`.files` (the layout on disk: the dense side in one file, the embedding
side as one snapshot per shard; finding, reading and validating them, torch-free so the
launcher and the model server can read them) and :mod:`.saving` (taking and restoring one from
a running :class:`~embeddb.trainer.ctx.TrainCtx`: torch and the client).

May import: :mod:`embeddb.client`, the trainer's lower layers (``trainer-layers`` contract).
"""
