"""The numpy array type aliases every layer uses: one definition each, imported everywhere.

A leaf module (it imports only numpy), so the innermost layers can use it too.
"""

from __future__ import annotations

from typing import TypeAlias

import numpy as np
import numpy.typing as npt

__all__ = ["F32", "F64", "I64", "U8", "U64", "Bool", "Floats", "IntP"]

F32: TypeAlias = npt.NDArray[np.float32]
F64: TypeAlias = npt.NDArray[np.float64]
I64: TypeAlias = npt.NDArray[np.int64]
U8: TypeAlias = npt.NDArray[np.uint8]
U64: TypeAlias = npt.NDArray[np.uint64]
IntP: TypeAlias = npt.NDArray[np.intp]
Bool: TypeAlias = npt.NDArray[np.bool_]
Floats: TypeAlias = npt.NDArray[np.floating]
