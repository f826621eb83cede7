"""The update log's settings: one validator per setting, shared with the store: section."""

from __future__ import annotations

import pytest

from embeddb.config import FsyncPolicy, LogRecovery, UpdateLogConfig
from embeddb.engine.durability.log_config import LogConfig
from embeddb.errors import ConfigError


def test_config_is_validated() -> None:
    assert LogConfig().fsync is FsyncPolicy.INTERVAL
    assert LogConfig(fsync="always").fsync is FsyncPolicy.ALWAYS  # type: ignore[arg-type]
    for bad in ({"fsync": "sometimes"}, {"fsync_interval_ms": 0}, {"segment_bytes": 0}):
        with pytest.raises(ConfigError):
            LogConfig(**bad)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="lz4_min_bytes"):
        LogConfig(lz4_min_bytes=-1)


@pytest.mark.parametrize(
    ("engine", "store", "bad"),
    [
        ("fsync", "fsync", "sometimes"),
        ("fsync_interval_ms", "fsync_interval_ms", float("inf")),  # accepted before
        ("fsync_interval_ms", "fsync_interval_ms", 1e9),  # accepted before
        ("lz4_min_bytes", "lz4_min_bytes", 1.5),  # accepted before
        ("segment_bytes", "segment_mb", "x"),  # a bare TypeError before
        ("recovery", "recovery", "maybe"),
    ],
)
def test_the_engine_and_the_store_section_share_one_validator(
    engine: str, store: str, bad: object
) -> None:
    """A log setting is checked once, by the store: section's validator, under its YAML name:
    the engine's LogConfig refuses exactly what UpdateLogConfig refuses, with its message."""
    with pytest.raises(ConfigError) as from_store:
        UpdateLogConfig(**{store: bad})
    with pytest.raises(ConfigError) as from_engine:
        LogConfig(**{engine: bad})
    assert str(from_engine.value) == str(from_store.value)


def test_the_log_config_of_a_store_section_carries_every_setting() -> None:
    settings = UpdateLogConfig(fsync="always", fsync_interval_ms=7, segment_mb=3,
                               lz4_min_bytes=9, recovery="point_in_time")  # fmt: skip
    cfg = LogConfig.of(settings)
    assert (cfg.fsync, cfg.fsync_interval_ms, cfg.segment_bytes, cfg.lz4_min_bytes) == (
        FsyncPolicy.ALWAYS, 7.0, 3 << 20, 9,
    )  # fmt: skip
    assert cfg.recovery is LogRecovery.POINT_IN_TIME
