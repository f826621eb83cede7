"""The ``embeddb`` command line. The only package that reads argv, environment or config files.

Commands:
    embeddb demo      train a factorization machine on UCI Adult with its embeddings in a shard
    embeddb train     run a training job (YAML): local shards, NN workers under torchrun
    embeddb serve     serve one shard over gRPC until SIGTERM/SIGINT (then shut down cleanly)
    embeddb serve-model  serve an exported model (gRPC + HTTP/JSON, micro-batched) until SIGTERM
    embeddb cluster   run N ``serve`` processes locally, health-checked and supervised
    embeddb snapshot  take a job checkpoint: every shard of a running cluster snapshots under one id
    embeddb restore   roll a stopped shard's directory back to one of its snapshots, offline
    embeddb reshard   rewrite a job checkpoint (one snapshot id on N shards) into M shards
    embeddb --version

``python -m embeddb.cli`` works too (the cluster starts its shards that way).

Modules: :mod:`~embeddb.cli.app` (the click group ``main``), one per command family,
:mod:`~embeddb.cli.train` (demo, train), :mod:`~embeddb.cli.serve` (serve, serve-model),
:mod:`~embeddb.cli.cluster`, :mod:`~embeddb.cli.durability` (snapshot, restore, reshard), and
what they share: :mod:`~embeddb.cli.options` (option groups: config and data directory, TLS,
tokens, metrics, log level) and :mod:`~embeddb.cli.common` (reading the files options name).
"""

from __future__ import annotations

from embeddb.cli.app import main

__all__ = ["main"]
