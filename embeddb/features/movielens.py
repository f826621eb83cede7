"""Reader of MovieLens 100K (GroupLens ``ml-100k``): ratings joined with users and movies.

Reads a ratings file (``u.data`` or an official split: ``u1.base`` .. ``u5.test``,
``ua.base`` .. ``ub.test``; each file plain or ``.gz``) and joins ``u.user`` and ``u.item``.
Each rating is a sample with these ID features (raw integers are their own ids; strings are
hashed in the feature's namespace, see :mod:`embeddb.features.hashing`):

    ==========  ================================================  =====================
    feature     id                                                ids per sample
    ==========  ================================================  =====================
    user_id     the user's number                                 1
    item_id     the movie's number                                1
    genres      the index (0..18) of each genre flag set in       1 to 6 (ragged)
                u.item, in u.genre's order (0 is "unknown")
    occupation  hash of the occupation string                     1
    gender      hash of "M" or "F"                                1
    age_bucket  MovieLens-1M's bucket: 1 (<18), 18, 25, 35, 45,   1
                50, 56 (>=56)
    zip_prefix  hash of the zip code's first ``zip_prefix``       1
                characters
    ==========  ================================================  =====================

a non-ID feature ``dense`` of shape ``(n, 4)`` float32: age / 100, the movie's age in years
when rated / 100 (0 when its release date is unknown), hour of day (UTC) / 24 and day of
week (Monday 0) / 7; and a label ``label`` of shape ``(n, 1)``: 1 where rating >=
``positive_rating`` (4 by default), else 0.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

from embeddb.common.arrays import F64, U64
from embeddb.errors import ConfigError, CorruptDataError, InvalidArgumentError, NotFoundError
from embeddb.features._block import Block, Ids
from embeddb.features._fields import Fields
from embeddb.features._io import line_chunks
from embeddb.features._lines import split_lines
from embeddb.features._reader import Chunk, Reader
from embeddb.features.delimited import TextChunk, read_text_table
from embeddb.features.hashing import hash_fields, namespace_seed

__all__ = ["ID_FEATURES", "SPLITS", "MovieLensConfig", "MovieLensReader"]

SPLITS = (
    "u.data",
    *(f"u{k}.{part}" for k in range(1, 6) for part in ("base", "test")),
    *(f"u{k}.{part}" for k in "ab" for part in ("base", "test")),
)
ID_FEATURES = (
    "user_id",
    "item_id",
    "genres",
    "occupation",
    "gender",
    "age_bucket",
    "zip_prefix",
)
_AGE_BUCKETS = np.array([1, 18, 25, 35, 45, 50, 56], dtype=np.uint64)
_SECONDS_PER_YEAR = 365.2425 * 86400


@dataclass(frozen=True)
class MovieLensConfig:
    """How to read MovieLens.

    Attributes:
        positive_rating: ratings at or above this are positives (label 1).
        zip_prefix: leading characters of the zip code that make the ``zip_prefix`` feature.
        dense: include the ``dense`` non-ID feature.
        chunk_bytes: bytes of the ratings file parsed at a time.
    """

    positive_rating: int = 4
    zip_prefix: int = 3
    dense: bool = True
    chunk_bytes: int = 1 << 20

    def __post_init__(self) -> None:
        if not 1 <= self.positive_rating <= 5:
            raise ConfigError("positive_rating", f"must be in [1, 5], got {self.positive_rating}")
        if self.zip_prefix < 1:
            raise ConfigError("zip_prefix", f"must be >= 1, got {self.zip_prefix}")


@dataclass(frozen=True)
class _Users:
    age: F64
    ids: dict[str, U64]  # occupation, gender, age_bucket, zip_prefix; indexed by user id
    known: npt.NDArray[np.bool_]


@dataclass(frozen=True)
class _Items:
    genres: Ids  # ragged, indexed by item id
    release_year: F64  # NaN when unknown
    known: npt.NDArray[np.bool_]


class MovieLensReader(Reader):
    """Batches of one MovieLens 100K ratings file, joined with users and movies.

    Args:
        directory: the ``ml-100k`` folder.
        batch_size: samples per batch (the last batch may be shorter).
        split: a ratings file of :data:`SPLITS` (default ``u1.base``; ``u1.test`` is its test).
        config: label threshold and features (:class:`MovieLensConfig`).
        requires_grad: training batches.
        drop_last: drop a short last batch.

    Raises:
        InvalidArgumentError: unknown split or bad ``batch_size``.
        NotFoundError: a file is missing.
        CorruptDataError: a malformed side table.
    """

    def __init__(
        self,
        directory: str | Path,
        batch_size: int,
        split: str = "u1.base",
        config: MovieLensConfig | None = None,
        *,
        requires_grad: bool = True,
        drop_last: bool = False,
    ) -> None:
        super().__init__(batch_size, requires_grad=requires_grad, drop_last=drop_last)
        if split not in SPLITS:
            raise InvalidArgumentError(f"unknown MovieLens split {split!r}; one of {SPLITS}")
        self.directory = Path(directory)
        self.split = split
        self.config = config or MovieLensConfig()
        self.path = self._file(split)
        self._users = self._read_users(self._file("u.user"))
        self._items = self._read_items(self._file("u.item"))

    def _file(self, name: str) -> Path:
        for candidate in (self.directory / name, self.directory / f"{name}.gz"):
            if candidate.is_file():
                return candidate
        raise NotFoundError(f"{self.directory} has neither {name} nor {name}.gz")

    def _read_users(self, path: Path) -> _Users:
        names = ("user", "age", "gender", "occupation", "zip")
        table = read_text_table(path, "|", names)
        user = _uints(table, "user")
        size = int(user.max(initial=0)) + 1
        age = _uints(table, "age")
        zips = table.text(["zip"])
        zips = Fields(
            zips.buf, zips.starts, np.minimum(zips.ends, zips.starts + self.config.zip_prefix)
        )
        bucket = _AGE_BUCKETS[np.searchsorted(_AGE_BUCKETS, age, side="right") - 1]
        per_user = {
            "occupation": hash_fields(table.text(["occupation"]), namespace_seed("occupation")),
            "gender": hash_fields(table.text(["gender"]), namespace_seed("gender")),
            "age_bucket": bucket,
            "zip_prefix": hash_fields(zips, namespace_seed("zip_prefix")),
        }
        ids = {}
        for key, values in per_user.items():
            column = np.zeros(size, dtype=np.uint64)
            column[user] = values
            ids[key] = column
        ages = np.zeros(size)
        ages[user] = age
        known = np.zeros(size, dtype=bool)
        known[user] = True
        return _Users(ages, ids, known)

    def _read_items(self, path: Path) -> _Items:
        flags = tuple(f"g{k}" for k in range(19))
        names = ("item", "title", "release", "video", "url", *flags)
        table = read_text_table(path, "|", names)
        item = _uints(table, "item")
        size = int(item.max(initial=0)) + 1
        release = table.text(["release"])  # "01-Jan-1995"
        year_fields = Fields(
            release.buf, np.maximum(release.ends - 4, release.starts), release.ends
        )
        years, present = table.checked(year_fields, ["release"], Fields.parse_uint)
        flag_text = table.text(list(flags))
        is_set = flag_text.buf[flag_text.starts] == ord("1")  # (items, 19)
        order = np.argsort(item)
        dense_flags = np.zeros((size, 19), dtype=bool)
        dense_flags[item[order]] = is_set[order]
        rows, genres = np.nonzero(dense_flags)
        offsets = np.zeros(size + 1, dtype=np.int64)
        np.cumsum(np.bincount(rows, minlength=size), out=offsets[1:])
        release_year = np.full(size, np.nan)
        release_year[item[present]] = years[present]
        known = np.zeros(size, dtype=bool)
        known[item] = True
        return _Items(Ids(genres.astype(np.uint64), offsets, False), release_year, known)

    def _blocks(self) -> Iterator[Block]:
        index = {"user": 0, "item": 1, "rating": 2, "time": 3}
        first_line = 1
        for chunk in line_chunks(self.path, self.config.chunk_bytes):
            lines = split_lines(chunk, ord("\t"), 4, None)
            if lines.bad.size:
                line, fields = (int(x) for x in lines.bad[0])
                raise CorruptDataError(f"{self.path}:{first_line + line}: {fields} fields, not 4")
            table = TextChunk(self.path, lines, first_line, index, strip=False)
            first_line += lines.line_count
            yield self._join(table)

    def _join(self, table: TextChunk) -> Block:
        user, item = _uints(table, "user"), _uints(table, "item")
        rating, time = _uints(table, "rating"), _uints(table, "time")
        users, items = self._users, self._items
        for name, key, known in (("user", user, users.known), ("item", item, items.known)):
            bad = (key >= known.size) | ~known[np.minimum(key, known.size - 1)]
            if bad.any():
                row = int(np.argmax(bad))
                raise CorruptDataError(f"{table.where(row)}: unknown {name} {int(key[row])}")
        u, i = user.astype(np.intp), item.astype(np.intp)
        ids = {
            "user_id": Ids(user, None, True),
            "item_id": Ids(item, None, True),
            "genres": items.genres.take(i),
        }
        ids |= {key: Ids(values[u], None, True) for key, values in users.ids.items()}
        dense: dict[str, npt.NDArray[np.float32]] = {}
        if self.config.dense:
            seconds = time.astype(np.float64)
            rated_year = 1970.0 + seconds / _SECONDS_PER_YEAR
            movie_age = np.nan_to_num(np.maximum(rated_year - items.release_year[i], 0.0))
            hour = (time // 3600) % 24
            weekday = (time // 86400 + 3) % 7  # 1970-01-01 was a Thursday
            columns = (users.age[u] / 100, movie_age / 100, hour / 24, weekday / 7)
            dense["dense"] = np.stack(columns, axis=1).astype(np.float32)
        label = (rating >= self.config.positive_rating).astype(np.float32).reshape(-1, 1)
        return Block(table.size, ids, dense, {"label": label})


def _uints(table: Chunk, column: str) -> U64:
    values, present = table.checked(table.text([column]), [column], Fields.parse_uint)
    if not present.all():
        row = int(np.argmin(present))
        raise CorruptDataError(f"{table.where(row)}: column {column!r} is empty")
    out: U64 = values.ravel()
    return out
