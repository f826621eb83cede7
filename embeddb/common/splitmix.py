"""The SplitMix64 finaliser's constants: the one definition every copy of the mix uses.

A leaf module (it imports only numpy), so :mod:`embeddb.common.routing` can use it without loading
numba. For a uint64 ``z`` the finaliser is::

    z = z + GAMMA
    z = (z ^ (z >> SHIFT_1)) * MULTIPLIER_1
    z = (z ^ (z >> SHIFT_2)) * MULTIPLIER_2
    z = z ^ (z >> SHIFT_3)

:func:`embeddb.common.routing.mix64` is the reference (whole arrays, numpy). The compiled copy on
one id is ``embeddb.common._routing_kernel.mix``, which the kernels of ``initializers``,
``storage.hash_index`` and ``client._kernels`` inline. It reads these names as module globals:
numba freezes them into the machine code when it compiles (and caches) a kernel. They are part
of the routing algorithm (``ROUTING_ALGORITHM``), so they never change;
``tests/test_splitmix.py`` checks every compiled copy against :func:`~embeddb.common.routing.mix64`.

All are ``numpy.uint64`` scalars, so compiled arithmetic stays in unsigned 64-bit integers.
"""

from __future__ import annotations

import numpy as np

__all__ = ["GAMMA", "MULTIPLIER_1", "MULTIPLIER_2", "SHIFT_1", "SHIFT_2", "SHIFT_3"]

GAMMA = np.uint64(0x9E37_79B9_7F4A_7C15)
"""The golden-ratio increment, 2**64 / phi, added before mixing."""
MULTIPLIER_1 = np.uint64(0xBF58_476D_1CE4_E5B9)
MULTIPLIER_2 = np.uint64(0x94D0_49BB_1331_11EB)
SHIFT_1 = np.uint64(30)
SHIFT_2 = np.uint64(27)
SHIFT_3 = np.uint64(31)
