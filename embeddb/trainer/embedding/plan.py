"""A batch's lookup plan, shared by the embedding worker and the model server
(:mod:`embeddb.serving.infer`): each ID feature's ids truncated, encoded (group prefix, hash
stack), concatenated per table and deduplicated once per table; and the looked-up rows pooled
back per feature. Pure numpy; no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from embeddb.client.batching import IdBatch
from embeddb.common.arrays import F32, I64, U64
from embeddb.config import EmbeddingConfig
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
    rounds: int  # hash-stack rounds (1 without a hash stack)
    dim: int
    segments: Segments
    spec: PoolingSpec


@dataclass
class LookupPlan:
    features: list[FeaturePlan]
    tables: dict[str, IdBatch]


def pooling_specs(
    embedding_config: EmbeddingConfig, overrides: Mapping[str, Pooling]
) -> dict[str, PoolingSpec]:
    """Every feature's pooling: the config's, or the override named for it."""
    return {
        name: PoolingSpec.of(feature, overrides.get(name))
        for name, feature in embedding_config.features.items()
    }


def plan_lookup(
    embedding_config: EmbeddingConfig,
    specs: Mapping[str, PoolingSpec],
    features: Sequence[IdFeature],
) -> LookupPlan:
    """Step 1 of the module docstring: each feature's ids truncated (sequence features),
    encoded (group prefix, hash stack), concatenated per table and deduplicated once per table.
    Feature names are trusted (checked by the caller against the config)."""
    parts: dict[str, list[U64]] = {}
    sizes: dict[str, int] = {}
    plans: list[FeaturePlan] = []
    for name, values, offsets in features:
        feature = embedding_config.features[name]
        spec = specs[name]
        if offsets is None:
            segments = Segments.single_ids(values.size)
        else:
            if spec.sequence:
                values, offsets = truncate(values, offsets, spec.fixed_size)
            segments = Segments.of(offsets)
        ids = feature.encode(values).reshape(-1)
        start = sizes.get(feature.table, 0)
        sizes[feature.table] = start + ids.size
        parts.setdefault(feature.table, []).append(ids)
        rounds = max(feature.hash_stack_rounds, 1)
        plans.append(
            FeaturePlan(
                name,
                feature.table,
                start,
                start + ids.size,
                rounds,
                feature.dim,
                segments,
                spec,
            )
        )
    tables = {
        table: IdBatch.of(chunks[0] if len(chunks) == 1 else np.concatenate(chunks))
        for table, chunks in parts.items()
    }
    return LookupPlan(plans, tables)


def pool_lookup(plan: LookupPlan, vectors: Mapping[str, F32]) -> list[Pooled]:
    """Step 4: the looked-up vectors of every table's unique ids pooled per feature, in the
    plan's feature order (hash-stack rounds summed first)."""
    expanded = {table: plan.tables[table].expand(v) for table, v in vectors.items()}
    out: list[Pooled] = []
    for fp in plan.features:
        rows = expanded[fp.table][fp.start : fp.stop]
        if fp.rounds > 1:
            rows = rows.reshape(-1, fp.rounds, rows.shape[1]).sum(axis=1)
        out.append(pool(rows, fp.segments, fp.spec))
    return out
