from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class IdFeature(_message.Message):
    __slots__ = ("name", "ids", "offsets")
    NAME_FIELD_NUMBER: _ClassVar[int]
    IDS_FIELD_NUMBER: _ClassVar[int]
    OFFSETS_FIELD_NUMBER: _ClassVar[int]
    name: str
    ids: bytes
    offsets: bytes
    def __init__(self, name: _Optional[str] = ..., ids: _Optional[bytes] = ..., offsets: _Optional[bytes] = ...) -> None: ...

class NonIdFeature(_message.Message):
    __slots__ = ("name", "values", "shape")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    name: str
    values: bytes
    shape: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, name: _Optional[str] = ..., values: _Optional[bytes] = ..., shape: _Optional[_Iterable[int]] = ...) -> None: ...

class PredictRequest(_message.Message):
    __slots__ = ("num_records", "id_features", "non_id_features", "records_json")
    NUM_RECORDS_FIELD_NUMBER: _ClassVar[int]
    ID_FEATURES_FIELD_NUMBER: _ClassVar[int]
    NON_ID_FEATURES_FIELD_NUMBER: _ClassVar[int]
    RECORDS_JSON_FIELD_NUMBER: _ClassVar[int]
    num_records: int
    id_features: _containers.RepeatedCompositeFieldContainer[IdFeature]
    non_id_features: _containers.RepeatedCompositeFieldContainer[NonIdFeature]
    records_json: bytes
    def __init__(self, num_records: _Optional[int] = ..., id_features: _Optional[_Iterable[_Union[IdFeature, _Mapping]]] = ..., non_id_features: _Optional[_Iterable[_Union[NonIdFeature, _Mapping]]] = ..., records_json: _Optional[bytes] = ...) -> None: ...

class PredictResponse(_message.Message):
    __slots__ = ("scores",)
    SCORES_FIELD_NUMBER: _ClassVar[int]
    scores: bytes
    def __init__(self, scores: _Optional[bytes] = ...) -> None: ...

class DescribeModelRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class NonIdInput(_message.Message):
    __slots__ = ("name", "shape")
    NAME_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    name: str
    shape: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, name: _Optional[str] = ..., shape: _Optional[_Iterable[int]] = ...) -> None: ...

class ModelLimits(_message.Message):
    __slots__ = ("max_message_bytes", "max_records")
    MAX_MESSAGE_BYTES_FIELD_NUMBER: _ClassVar[int]
    MAX_RECORDS_FIELD_NUMBER: _ClassVar[int]
    max_message_bytes: int
    max_records: int
    def __init__(self, max_message_bytes: _Optional[int] = ..., max_records: _Optional[int] = ...) -> None: ...

class DescribeModelResponse(_message.Message):
    __slots__ = ("id_features", "non_id_inputs", "raw_records", "limits", "snapshot_id")
    ID_FEATURES_FIELD_NUMBER: _ClassVar[int]
    NON_ID_INPUTS_FIELD_NUMBER: _ClassVar[int]
    RAW_RECORDS_FIELD_NUMBER: _ClassVar[int]
    LIMITS_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_ID_FIELD_NUMBER: _ClassVar[int]
    id_features: _containers.RepeatedScalarFieldContainer[str]
    non_id_inputs: _containers.RepeatedCompositeFieldContainer[NonIdInput]
    raw_records: bool
    limits: ModelLimits
    snapshot_id: str
    def __init__(self, id_features: _Optional[_Iterable[str]] = ..., non_id_inputs: _Optional[_Iterable[_Union[NonIdInput, _Mapping]]] = ..., raw_records: _Optional[bool] = ..., limits: _Optional[_Union[ModelLimits, _Mapping]] = ..., snapshot_id: _Optional[str] = ...) -> None: ...
