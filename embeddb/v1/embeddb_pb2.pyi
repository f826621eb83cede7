from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class DType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    D_TYPE_UNSPECIFIED: _ClassVar[DType]
    D_TYPE_UINT64: _ClassVar[DType]
    D_TYPE_FLOAT32: _ClassVar[DType]
    D_TYPE_FLOAT16: _ClassVar[DType]

class Compression(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    COMPRESSION_UNSPECIFIED: _ClassVar[Compression]
    COMPRESSION_LZ4: _ClassVar[Compression]
D_TYPE_UNSPECIFIED: DType
D_TYPE_UINT64: DType
D_TYPE_FLOAT32: DType
D_TYPE_FLOAT16: DType
COMPRESSION_UNSPECIFIED: Compression
COMPRESSION_LZ4: Compression

class Tensor(_message.Message):
    __slots__ = ("dtype", "shape", "data", "compression", "row_scales")
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    COMPRESSION_FIELD_NUMBER: _ClassVar[int]
    ROW_SCALES_FIELD_NUMBER: _ClassVar[int]
    dtype: DType
    shape: _containers.RepeatedScalarFieldContainer[int]
    data: bytes
    compression: Compression
    row_scales: bytes
    def __init__(self, dtype: _Optional[_Union[DType, str]] = ..., shape: _Optional[_Iterable[int]] = ..., data: _Optional[bytes] = ..., compression: _Optional[_Union[Compression, str]] = ..., row_scales: _Optional[bytes] = ...) -> None: ...

class Encoding(_message.Message):
    __slots__ = ("fp16", "lz4_min_bytes")
    FP16_FIELD_NUMBER: _ClassVar[int]
    LZ4_MIN_BYTES_FIELD_NUMBER: _ClassVar[int]
    fp16: bool
    lz4_min_bytes: int
    def __init__(self, fp16: _Optional[bool] = ..., lz4_min_bytes: _Optional[int] = ...) -> None: ...

class LookupRequest(_message.Message):
    __slots__ = ("table", "ids", "train", "encoding")
    TABLE_FIELD_NUMBER: _ClassVar[int]
    IDS_FIELD_NUMBER: _ClassVar[int]
    TRAIN_FIELD_NUMBER: _ClassVar[int]
    ENCODING_FIELD_NUMBER: _ClassVar[int]
    table: str
    ids: Tensor
    train: bool
    encoding: Encoding
    def __init__(self, table: _Optional[str] = ..., ids: _Optional[_Union[Tensor, _Mapping]] = ..., train: _Optional[bool] = ..., encoding: _Optional[_Union[Encoding, _Mapping]] = ...) -> None: ...

class LookupResponse(_message.Message):
    __slots__ = ("vectors",)
    VECTORS_FIELD_NUMBER: _ClassVar[int]
    vectors: Tensor
    def __init__(self, vectors: _Optional[_Union[Tensor, _Mapping]] = ...) -> None: ...

class ApplyGradientsRequest(_message.Message):
    __slots__ = ("table", "ids", "grads")
    TABLE_FIELD_NUMBER: _ClassVar[int]
    IDS_FIELD_NUMBER: _ClassVar[int]
    GRADS_FIELD_NUMBER: _ClassVar[int]
    table: str
    ids: Tensor
    grads: Tensor
    def __init__(self, table: _Optional[str] = ..., ids: _Optional[_Union[Tensor, _Mapping]] = ..., grads: _Optional[_Union[Tensor, _Mapping]] = ...) -> None: ...

class ApplyGradientsResponse(_message.Message):
    __slots__ = ("applied", "nan_skipped", "missing")
    APPLIED_FIELD_NUMBER: _ClassVar[int]
    NAN_SKIPPED_FIELD_NUMBER: _ClassVar[int]
    MISSING_FIELD_NUMBER: _ClassVar[int]
    applied: int
    nan_skipped: int
    missing: int
    def __init__(self, applied: _Optional[int] = ..., nan_skipped: _Optional[int] = ..., missing: _Optional[int] = ...) -> None: ...

class LookupManyRequest(_message.Message):
    __slots__ = ("lookups",)
    LOOKUPS_FIELD_NUMBER: _ClassVar[int]
    lookups: _containers.RepeatedCompositeFieldContainer[LookupRequest]
    def __init__(self, lookups: _Optional[_Iterable[_Union[LookupRequest, _Mapping]]] = ...) -> None: ...

class LookupManyResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[LookupResponse]
    def __init__(self, results: _Optional[_Iterable[_Union[LookupResponse, _Mapping]]] = ...) -> None: ...

class ApplyGradientsManyRequest(_message.Message):
    __slots__ = ("updates",)
    UPDATES_FIELD_NUMBER: _ClassVar[int]
    updates: _containers.RepeatedCompositeFieldContainer[ApplyGradientsRequest]
    def __init__(self, updates: _Optional[_Iterable[_Union[ApplyGradientsRequest, _Mapping]]] = ...) -> None: ...

class ApplyGradientsManyResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[ApplyGradientsResponse]
    def __init__(self, results: _Optional[_Iterable[_Union[ApplyGradientsResponse, _Mapping]]] = ...) -> None: ...

class AssignRequest(_message.Message):
    __slots__ = ("table", "ids", "vectors")
    TABLE_FIELD_NUMBER: _ClassVar[int]
    IDS_FIELD_NUMBER: _ClassVar[int]
    VECTORS_FIELD_NUMBER: _ClassVar[int]
    table: str
    ids: Tensor
    vectors: Tensor
    def __init__(self, table: _Optional[str] = ..., ids: _Optional[_Union[Tensor, _Mapping]] = ..., vectors: _Optional[_Union[Tensor, _Mapping]] = ...) -> None: ...

class AssignResponse(_message.Message):
    __slots__ = ("written",)
    WRITTEN_FIELD_NUMBER: _ClassVar[int]
    written: int
    def __init__(self, written: _Optional[int] = ...) -> None: ...

class DeleteRequest(_message.Message):
    __slots__ = ("table", "ids")
    TABLE_FIELD_NUMBER: _ClassVar[int]
    IDS_FIELD_NUMBER: _ClassVar[int]
    table: str
    ids: Tensor
    def __init__(self, table: _Optional[str] = ..., ids: _Optional[_Union[Tensor, _Mapping]] = ...) -> None: ...

class DeleteResponse(_message.Message):
    __slots__ = ("deleted",)
    DELETED_FIELD_NUMBER: _ClassVar[int]
    deleted: int
    def __init__(self, deleted: _Optional[int] = ...) -> None: ...

class TableInfo(_message.Message):
    __slots__ = ("name", "dim", "optimizer", "state_dim", "capacity")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DIM_FIELD_NUMBER: _ClassVar[int]
    OPTIMIZER_FIELD_NUMBER: _ClassVar[int]
    STATE_DIM_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_FIELD_NUMBER: _ClassVar[int]
    name: str
    dim: int
    optimizer: str
    state_dim: int
    capacity: int
    def __init__(self, name: _Optional[str] = ..., dim: _Optional[int] = ..., optimizer: _Optional[str] = ..., state_dim: _Optional[int] = ..., capacity: _Optional[int] = ...) -> None: ...

class ListTablesRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListTablesResponse(_message.Message):
    __slots__ = ("tables",)
    TABLES_FIELD_NUMBER: _ClassVar[int]
    tables: _containers.RepeatedCompositeFieldContainer[TableInfo]
    def __init__(self, tables: _Optional[_Iterable[_Union[TableInfo, _Mapping]]] = ...) -> None: ...

class DescribeTableRequest(_message.Message):
    __slots__ = ("table",)
    TABLE_FIELD_NUMBER: _ClassVar[int]
    table: str
    def __init__(self, table: _Optional[str] = ...) -> None: ...

class DescribeTableResponse(_message.Message):
    __slots__ = ("name", "dim", "optimizer", "state_dim", "capacity")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DIM_FIELD_NUMBER: _ClassVar[int]
    OPTIMIZER_FIELD_NUMBER: _ClassVar[int]
    STATE_DIM_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_FIELD_NUMBER: _ClassVar[int]
    name: str
    dim: int
    optimizer: str
    state_dim: int
    capacity: int
    def __init__(self, name: _Optional[str] = ..., dim: _Optional[int] = ..., optimizer: _Optional[str] = ..., state_dim: _Optional[int] = ..., capacity: _Optional[int] = ...) -> None: ...

class StatsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class TableStats(_message.Message):
    __slots__ = ("table", "counters")
    class CountersEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    TABLE_FIELD_NUMBER: _ClassVar[int]
    COUNTERS_FIELD_NUMBER: _ClassVar[int]
    table: str
    counters: _containers.ScalarMap[str, int]
    def __init__(self, table: _Optional[str] = ..., counters: _Optional[_Mapping[str, int]] = ...) -> None: ...

class StatsResponse(_message.Message):
    __slots__ = ("shard_index", "num_shards", "tables")
    SHARD_INDEX_FIELD_NUMBER: _ClassVar[int]
    NUM_SHARDS_FIELD_NUMBER: _ClassVar[int]
    TABLES_FIELD_NUMBER: _ClassVar[int]
    shard_index: int
    num_shards: int
    tables: _containers.RepeatedCompositeFieldContainer[TableStats]
    def __init__(self, shard_index: _Optional[int] = ..., num_shards: _Optional[int] = ..., tables: _Optional[_Iterable[_Union[TableStats, _Mapping]]] = ...) -> None: ...

class ScanRequest(_message.Message):
    __slots__ = ("table", "after_id", "limit", "encoding")
    TABLE_FIELD_NUMBER: _ClassVar[int]
    AFTER_ID_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    ENCODING_FIELD_NUMBER: _ClassVar[int]
    table: str
    after_id: int
    limit: int
    encoding: Encoding
    def __init__(self, table: _Optional[str] = ..., after_id: _Optional[int] = ..., limit: _Optional[int] = ..., encoding: _Optional[_Union[Encoding, _Mapping]] = ...) -> None: ...

class ScanResponse(_message.Message):
    __slots__ = ("ids", "vectors", "last_id", "done")
    IDS_FIELD_NUMBER: _ClassVar[int]
    VECTORS_FIELD_NUMBER: _ClassVar[int]
    LAST_ID_FIELD_NUMBER: _ClassVar[int]
    DONE_FIELD_NUMBER: _ClassVar[int]
    ids: Tensor
    vectors: Tensor
    last_id: int
    done: bool
    def __init__(self, ids: _Optional[_Union[Tensor, _Mapping]] = ..., vectors: _Optional[_Union[Tensor, _Mapping]] = ..., last_id: _Optional[int] = ..., done: _Optional[bool] = ...) -> None: ...

class DescribeShardRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Routing(_message.Message):
    __slots__ = ("algorithm", "salt")
    ALGORITHM_FIELD_NUMBER: _ClassVar[int]
    SALT_FIELD_NUMBER: _ClassVar[int]
    algorithm: str
    salt: int
    def __init__(self, algorithm: _Optional[str] = ..., salt: _Optional[int] = ...) -> None: ...

class ServerLimits(_message.Message):
    __slots__ = ("max_message_bytes", "max_ids_per_request", "max_response_bytes")
    MAX_MESSAGE_BYTES_FIELD_NUMBER: _ClassVar[int]
    MAX_IDS_PER_REQUEST_FIELD_NUMBER: _ClassVar[int]
    MAX_RESPONSE_BYTES_FIELD_NUMBER: _ClassVar[int]
    max_message_bytes: int
    max_ids_per_request: int
    max_response_bytes: int
    def __init__(self, max_message_bytes: _Optional[int] = ..., max_ids_per_request: _Optional[int] = ..., max_response_bytes: _Optional[int] = ...) -> None: ...

class DescribeShardResponse(_message.Message):
    __slots__ = ("shard_index", "num_shards", "routing", "limits", "follower")
    SHARD_INDEX_FIELD_NUMBER: _ClassVar[int]
    NUM_SHARDS_FIELD_NUMBER: _ClassVar[int]
    ROUTING_FIELD_NUMBER: _ClassVar[int]
    LIMITS_FIELD_NUMBER: _ClassVar[int]
    FOLLOWER_FIELD_NUMBER: _ClassVar[int]
    shard_index: int
    num_shards: int
    routing: Routing
    limits: ServerLimits
    follower: bool
    def __init__(self, shard_index: _Optional[int] = ..., num_shards: _Optional[int] = ..., routing: _Optional[_Union[Routing, _Mapping]] = ..., limits: _Optional[_Union[ServerLimits, _Mapping]] = ..., follower: _Optional[bool] = ...) -> None: ...

class SnapshotRequest(_message.Message):
    __slots__ = ("snapshot_id",)
    SNAPSHOT_ID_FIELD_NUMBER: _ClassVar[int]
    snapshot_id: str
    def __init__(self, snapshot_id: _Optional[str] = ...) -> None: ...

class SnapshotResponse(_message.Message):
    __slots__ = ("snapshot_id", "seq", "bytes", "pause_ms", "seconds", "shard_index")
    SNAPSHOT_ID_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    PAUSE_MS_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    SHARD_INDEX_FIELD_NUMBER: _ClassVar[int]
    snapshot_id: str
    seq: int
    bytes: int
    pause_ms: float
    seconds: float
    shard_index: int
    def __init__(self, snapshot_id: _Optional[str] = ..., seq: _Optional[int] = ..., bytes: _Optional[int] = ..., pause_ms: _Optional[float] = ..., seconds: _Optional[float] = ..., shard_index: _Optional[int] = ...) -> None: ...

class ListSnapshotsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class SnapshotInfo(_message.Message):
    __slots__ = ("snapshot_id", "seq", "bytes", "created")
    SNAPSHOT_ID_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    snapshot_id: str
    seq: int
    bytes: int
    created: float
    def __init__(self, snapshot_id: _Optional[str] = ..., seq: _Optional[int] = ..., bytes: _Optional[int] = ..., created: _Optional[float] = ...) -> None: ...

class ListSnapshotsResponse(_message.Message):
    __slots__ = ("snapshots",)
    SNAPSHOTS_FIELD_NUMBER: _ClassVar[int]
    snapshots: _containers.RepeatedCompositeFieldContainer[SnapshotInfo]
    def __init__(self, snapshots: _Optional[_Iterable[_Union[SnapshotInfo, _Mapping]]] = ...) -> None: ...

class SubscribeRequest(_message.Message):
    __slots__ = ("from_seq",)
    FROM_SEQ_FIELD_NUMBER: _ClassVar[int]
    from_seq: int
    def __init__(self, from_seq: _Optional[int] = ...) -> None: ...

class SubscribeResponse(_message.Message):
    __slots__ = ("seq", "payload", "primary_seq", "appended_at")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    PRIMARY_SEQ_FIELD_NUMBER: _ClassVar[int]
    APPENDED_AT_FIELD_NUMBER: _ClassVar[int]
    seq: int
    payload: bytes
    primary_seq: int
    appended_at: float
    def __init__(self, seq: _Optional[int] = ..., payload: _Optional[bytes] = ..., primary_seq: _Optional[int] = ..., appended_at: _Optional[float] = ...) -> None: ...

class FetchSnapshotRequest(_message.Message):
    __slots__ = ("snapshot_id", "take_new")
    SNAPSHOT_ID_FIELD_NUMBER: _ClassVar[int]
    TAKE_NEW_FIELD_NUMBER: _ClassVar[int]
    snapshot_id: str
    take_new: bool
    def __init__(self, snapshot_id: _Optional[str] = ..., take_new: _Optional[bool] = ...) -> None: ...

class FetchSnapshotResponse(_message.Message):
    __slots__ = ("snapshot_id", "seq", "path", "offset", "data")
    SNAPSHOT_ID_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    snapshot_id: str
    seq: int
    path: str
    offset: int
    data: bytes
    def __init__(self, snapshot_id: _Optional[str] = ..., seq: _Optional[int] = ..., path: _Optional[str] = ..., offset: _Optional[int] = ..., data: _Optional[bytes] = ...) -> None: ...
