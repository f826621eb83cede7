"""What each role may call of the shard's ``EmbeddingStore`` service (:data:`STORE_POLICY`,
enforced by :class:`~embeddb.transport.rpc.boundary.Boundary`; tokens and roles:
:mod:`embeddb.transport.rpc.auth`).

=========================  ==============================================================
role                       may call (``EmbeddingStore``)
=========================  ==============================================================
``Role.READ_WRITE`` (rw)   everything
``Role.REPLICA`` (replica) what ``ro`` may, plus the bulk reads: ``Scan`` (every row of a
                           table, page by page), ``Subscribe`` (the update log) and
                           ``FetchSnapshot`` (snapshot files, ``take_new`` included): a
                           follower's token, or an export's
``Role.READ_ONLY`` (ro)    ``Lookup`` with ``train=false``, ``LookupMany`` whose every part
                           has ``train=false`` (the rows of the ids it names, no others),
                           ``ListTables``, ``DescribeTable``, ``DescribeShard``, ``Stats``,
                           ``ListSnapshots``
=========================  ==============================================================

A training lookup is a write: it creates admitted rows, promotes disk rows and refreshes
recency, so a read-only caller gets ``PERMISSION_DENIED`` for it. An ``ro`` token reads only
the ids it names: ``Scan`` would hand it every row of a table without knowing a single id, so
it needs a ``replica`` or ``rw`` token (``embeddb scan`` too). ``Subscribe`` and
``FetchSnapshot`` read far more than evaluation lookups can — every logged row since any seq
(rows deleted since included), every row of a snapshot with its optimizer state — and
``FetchSnapshot`` may make the primary take a snapshot (a pause of the mutations): only
``replica`` and ``rw`` tokens may call them, so an ``ro`` token can never trigger a snapshot.
"""

from __future__ import annotations

from typing import Any

from embeddb.errors import PermissionDeniedError
from embeddb.transport.rpc.auth import AccessPolicy, Role

__all__ = ["STORE_POLICY"]

_WHY = {
    "Scan": " (it reads every row of a table: a replica or read-write token is needed)",
    "Subscribe": " (it streams every logged row: a replica token is needed)",
    "FetchSnapshot": " (it streams every row of a snapshot: a replica token is needed)",
    "Snapshot": " (taking a snapshot pauses mutations: a read-write token is needed)",
}

_READS = frozenset(
    {
        "Lookup",
        "LookupMany",
        "ListTables",
        "DescribeTable",
        "DescribeShard",
        "Stats",
        "ListSnapshots",
    }
)


def _refuse_training_lookup(request: Any) -> None:
    if request.train:
        raise PermissionDeniedError(
            "a read-only (ro) or replica token may not run a training lookup (train=true "
            "creates rows and refreshes recency); send train=false or use a read-write token"
        )


def _refuse_training_lookups(request: Any) -> None:
    for part in request.lookups:
        _refuse_training_lookup(part)


STORE_POLICY = AccessPolicy(
    allowed={
        Role.READ_WRITE: None,
        Role.REPLICA: _READS | {"Scan", "Subscribe", "FetchSnapshot"},
        Role.READ_ONLY: _READS,
    },
    checks={
        (role, method): check
        for role in (Role.READ_ONLY, Role.REPLICA)
        for method, check in (
            ("Lookup", _refuse_training_lookup),
            ("LookupMany", _refuse_training_lookups),
        )
    },
    why=_WHY,
)
"""The ``EmbeddingStore`` policy of the module docstring."""
