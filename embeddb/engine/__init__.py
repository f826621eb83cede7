"""The embedding engine: one shard and everything under it, runnable without a network.

Owns: :mod:`.shard` (:class:`~embeddb.engine.shard.Shard`, the facade every server and the
demo open: its lifecycle) and its parts: :mod:`.data_plane` (the data calls on the tables, the
base of ``Shard``), :mod:`.validation` (the checks of every request's arguments),
:mod:`.journal` (the update log's write side, the commit point of a mutation),
:mod:`.snapshots` (taking and finding snapshots), :mod:`.feed` (feeding followers and
exports), :mod:`.recovery` (opening a data directory); below them :mod:`.durability` (the
update log, snapshots, manifests, resharding, the file-fault seam), :mod:`.storage` (the RAM
tier over the RocksDB tier), :mod:`.optim` (server-side optimizers), :mod:`.initializers`
(deterministic row initialisers), and :mod:`.warmup` (compiles their kernels before serving).

May import: :mod:`embeddb.config`, :mod:`embeddb.common`, :mod:`embeddb.errors`, numpy, numba,
rocksdict, lz4. Never grpc, torch, :mod:`embeddb.transport` or an SDK (the ``engine`` contract
in pyproject.toml): the engine and the transport are independent stacks that
:mod:`embeddb.server` joins.
"""
