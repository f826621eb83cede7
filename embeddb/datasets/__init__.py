"""Datasets shipped with embeddb (only those whose licence allows redistribution).

* ``adult``: UCI Adult / Census Income (Becker & Kohavi, 1996), CC BY 4.0; see
  ``embeddb/datasets/adult/SOURCE.md``.
"""

from __future__ import annotations

from embeddb.datasets.adult import ADULT_DIR, AdultTable, load_adult

__all__ = ["ADULT_DIR", "AdultTable", "load_adult"]
