"""A batch's lookup plan, shared by the embedding worker and the model server
(:mod:`embeddb.serving.infer`): each ID feature's ids truncated, encoded (group prefix, hash
stack), concatenated table after table and deduplicated per table in one compiled pass
(:class:`~embeddb.client.batching.TableBatches`); and the looked-up rows pooled back per
feature. Pure numpy; no I/O.

No array work per table: ids without a hash stack are prefixed all together (one masked OR over
the concatenated ids), every table is deduplicated by one kernel call, and the answers of all
tables (when they share one ``dim``) are expanded to the ids' order by one gather. What remains
per feature is bookkeeping (its slice of the concatenated ids, its pooling).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from embeddb.client.batching import TableBatches
from embeddb.common.arrays import F32, I64, U64
from embeddb.config import EmbeddingConfig, FeatureConfig
from embeddb.trainer.pooling import Pooled, Pooling, PoolingSpec, Segments, pool, truncate

__all__ = ["FeaturePlan", "IdFeature", "LookupPlan", "plan_lookup", "pool_lookup", "pooling_specs"]

IdFeature = tuple[str, U64, "I64 | None"]
"""One ID feature of a batch as the NN worker sends it: name, raw ids in sample order, and CSR
offsets (``None`` when every sample has exactly one id)."""


@dataclass
class FeaturePlan:
    name: str
    table: str
    start: int  # rows of the table's concatenated ids
    stop: int
    offset: int  # where the feature's rows start in every table's concatenated ids
    rounds: int  # hash-stack rounds (1 without a hash stack)
    dim: int
    segments: Segments
    spec: PoolingSpec


@dataclass
class LookupPlan:
    """``features`` in the batch's order; ``tables`` every table's deduplicated ids (a mapping
    table → ``IdBatch`` too), tables in the order the features first read them."""

    features: list[FeaturePlan]
    tables: TableBatches

    @property
    def dims(self) -> set[int]:
        """The dims of the plan's tables."""
        return {fp.dim for fp in self.features}


def pooling_specs(
    embedding_config: EmbeddingConfig, overrides: Mapping[str, Pooling]
) -> dict[str, PoolingSpec]:
    """Every feature's pooling: the config's, or the override named for it."""
    return {
        name: PoolingSpec.of(feature, overrides.get(name))
        for name, feature in embedding_config.features.items()
    }


_SINGLE: dict[int, Segments] = {}  # batch size → segments of one id per sample (immutable)


def _single(batch_size: int) -> Segments:
    segments = _SINGLE.get(batch_size)
    if segments is None:
        if len(_SINGLE) >= 64:
            _SINGLE.clear()
        segments = _SINGLE[batch_size] = Segments.single_ids(batch_size)
    return segments


def plan_lookup(
    embedding_config: EmbeddingConfig,
    specs: Mapping[str, PoolingSpec],
    features: Sequence[IdFeature],
) -> LookupPlan:
    """Step 1 of the module docstring: each feature's ids truncated (sequence features),
    encoded (group prefix, hash stack), concatenated table after table and deduplicated once
    per table. Feature names are trusted (checked by the caller against the config)."""
    configs: list[FeatureConfig] = []
    raws: list[U64] = []
    segs: list[Segments] = []
    by_table: dict[str, list[int]] = {}
    for i, (name, values, offsets) in enumerate(features):
        feature = embedding_config.features[name]
        if offsets is None:
            segments = _single(values.size)
        else:
            spec = specs[name]
            if spec.sequence:
                values, offsets = truncate(values, offsets, spec.fixed_size)
            segments = Segments.of(offsets)
        configs.append(feature)
        raws.append(values)
        segs.append(segments)
        by_table.setdefault(feature.table, []).append(i)
    order = [i for members in by_table.values() for i in members]
    ids = _encode([configs[i] for i in order], [raws[i] for i in order])
    plans: list[FeaturePlan | None] = [None] * len(configs)
    id_bounds = np.zeros(len(by_table) + 1, dtype=np.int64)
    offset = 0
    for t, members in enumerate(by_table.values()):
        start = 0
        for i in members:
            feature = configs[i]
            rounds = max(feature.hash_stack_rounds, 1)
            size = segs[i].size * rounds
            plans[i] = FeaturePlan(
                feature.name,
                feature.table,
                start,
                start + size,
                offset + start,
                rounds,
                feature.dim,
                segs[i],
                specs[feature.name],
            )
            start += size
        offset += start
        id_bounds[t + 1] = offset
    tables = TableBatches.of(list(by_table), ids, id_bounds)
    return LookupPlan([fp for fp in plans if fp is not None], tables)


def _encode(features: Sequence[FeatureConfig], raws: Sequence[U64]) -> U64:
    """Every feature's table ids, concatenated in ``features`` order.

    Features without a hash stack whose ids are already a 1-D ``uint64`` array (what the NN
    worker sends) are prefixed together: one OR over the concatenated ids with each feature's
    group prefix; any other feature goes through :meth:`FeatureConfig.encode` (which validates
    its ids and names the feature in its error)."""
    plain = [
        f.hash_stack_rounds == 0
        and isinstance(v, np.ndarray)
        and v.dtype == np.uint64
        and v.ndim == 1
        for f, v in zip(features, raws, strict=True)
    ]
    if not all(plain):
        parts = [
            _prefixed(f, v) if ok else f.encode(v).reshape(-1)
            for f, v, ok in zip(features, raws, plain, strict=True)
        ]
        return np.concatenate(parts) if parts else np.empty(0, np.uint64)
    if not raws:
        return np.empty(0, np.uint64)
    raw = raws[0] if len(raws) == 1 else np.concatenate(raws)
    masks = {(f.prefix_bits, f.group_index) for f in features}
    if len(masks) == 1:
        low, high = _prefix(features[0])
        encoded: U64 = (raw & low) | high
        return encoded
    sizes = [v.size for v in raws]
    pairs = [_prefix(f) for f in features]
    low_mask = np.repeat(np.array([p[0] for p in pairs], np.uint64), sizes)
    high_bits = np.repeat(np.array([p[1] for p in pairs], np.uint64), sizes)
    out: U64 = (raw & low_mask) | high_bits
    return out


def _prefix(feature: FeatureConfig) -> tuple[np.uint64, np.uint64]:
    """``(low mask, prefix)``: an id of ``feature`` encodes to ``id & low | prefix`` (as
    :func:`embeddb.common.routing.with_group_prefix`; the config checked the group index)."""
    return _prefix_of(feature.prefix_bits, feature.group_index)


@functools.lru_cache(maxsize=4096)
def _prefix_of(bits: int, group_index: int) -> tuple[np.uint64, np.uint64]:
    if bits == 0:
        return np.uint64(0xFFFF_FFFF_FFFF_FFFF), np.uint64(0)
    return np.uint64((1 << (64 - bits)) - 1), np.uint64(group_index) << np.uint64(64 - bits)


def _prefixed(feature: FeatureConfig, values: U64) -> U64:
    low, high = _prefix(feature)
    out: U64 = (values & low) | high
    return out


def pool_lookup(plan: LookupPlan, vectors: Mapping[str, F32] | F32) -> list[Pooled]:
    """Step 4: the looked-up vectors of every table's unique ids pooled per feature, in the
    plan's feature order (hash-stack rounds summed first).

    ``vectors`` is table → its unique ids' vectors, or (tables of one ``dim``) one array of
    every table's, ``plan.tables.unique`` order, expanded by one gather; pooled arrays of the
    latter may be views of that gather's result (a fresh array)."""
    if isinstance(vectors, np.ndarray):
        rows_all = plan.tables.expand(vectors)
        fresh = rows_all is not vectors
        out: list[Pooled] = []
        for fp in plan.features:
            rows = rows_all[fp.offset : fp.offset + fp.stop - fp.start]
            if fp.rounds > 1:
                rows = rows.reshape(-1, fp.rounds, rows.shape[1]).sum(axis=1)
            elif fresh and fp.segments.single and not fp.spec.sequence:
                out.append(rows)  # pooling one id per sample is the identity
                continue
            out.append(pool(rows, fp.segments, fp.spec))
        return out
    expanded = {table: plan.tables[table].expand(v) for table, v in vectors.items()}
    out = []
    for fp in plan.features:
        rows = expanded[fp.table][fp.start : fp.stop]
        if fp.rounds > 1:
            rows = rows.reshape(-1, fp.rounds, rows.shape[1]).sum(axis=1)
        out.append(pool(rows, fp.segments, fp.spec))
    return out
