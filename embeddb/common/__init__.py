"""The vocabulary every part of embeddb shares; it imports only :mod:`embeddb.errors`.

Modules: :mod:`.arrays` (the numpy array aliases), :mod:`.routing` (id arithmetic: which shard
and stripe owns an id, id validation; its compiled check in :mod:`._routing_kernel`),
:mod:`.splitmix` (the one SplitMix64 finaliser), :mod:`.allocator` (glibc arena limits for
servers and clients), :mod:`.secrets` (owner-only token files), :mod:`.progress` (TTY-aware
progress of long commands), :mod:`.evaluation` (AUC and log loss in numpy).
"""
