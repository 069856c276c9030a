"""The controller <-> CPU slice worker wire format and gRPC settings.

Both sides import this module, so the byte layout, the method names and the
channel/server options cannot drift apart. Messages are msgpack (no pickle:
a worker must never execute what it is sent, apart from the StableHLO program
it is asked to run). An array travels as `[dtype name, shape, raw bytes]` in
little-endian C order; `ml_dtypes` names (bfloat16, float8_*) are understood.

The gRPC service has no .proto file: the worker registers generic handlers
over raw bytes and the client calls the same method paths, so there is no
code generation step.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from typing import Any

import ml_dtypes
import msgpack
import numpy as np

from elastic_jax import contract

SERVICE_NAME = "elastic_jax.SliceWorker"
PING = "Ping"
LOAD = "Load"
STEP = "Step"


def method_path(method: str) -> str:
    """The full gRPC path of a worker method, e.g. `/elastic_jax.SliceWorker/Step`."""
    return f"/{SERVICE_NAME}/{method}"


# Trailing-metadata marker the worker attaches when *it* answered with an
# error (a bad program, bad inputs, or a JAX/XLA failure while compiling or
# running). Without it a non-OK status is a transport failure: the client
# needs that split to tell "slice down" from "user code broken".
ERROR_KIND_KEY = "elastic-jax-error-kind"
EXECUTION_ERROR = "execution"

# Every call carries the job's token (the per-job Secret the control API uses too)
# as `authorization: Bearer <token>` metadata; the worker refuses any other call
# with UNAUTHENTICATED before reading its request.
AUTH_METADATA_KEY = "authorization"


def auth_metadata(token: str) -> tuple[tuple[str, str], ...]:
    """The call metadata that authenticates a call to a worker."""
    return ((AUTH_METADATA_KEY, f"Bearer {token}"),)


# gRPC caps messages at 4 MiB by default; a step ships a chunk of the batch and
# the whole parameter tree, and returns the gradients (about 2x the parameters'
# bytes each way). The cap bounds what a peer can make either side buffer;
# raise it for a model whose parameters exceed ~120 MiB (both ends read it).
MAX_MESSAGE_BYTES_ENV = contract.ENV_MAX_MESSAGE_BYTES
DEFAULT_MAX_MESSAGE_BYTES = 256 * 2**20


def max_message_bytes() -> int:
    """The message cap: `$ELASTIC_JAX_MAX_MESSAGE_BYTES`, else 256 MiB (at most 2 GiB - 1, gRPC's limit).

    Raises:
      ValueError: the variable is not a positive integer.
    """
    raw = os.environ.get(MAX_MESSAGE_BYTES_ENV)
    if raw is None:
        return DEFAULT_MAX_MESSAGE_BYTES
    if not raw.isdigit() or int(raw) < 1:
        raise ValueError(f"{MAX_MESSAGE_BYTES_ENV}={raw!r}: expected a positive number of bytes")
    return min(int(raw), 2**31 - 1)


class MessageTooLargeError(ValueError):
    """A request is over the message cap; `str()` names the sizes and the variable to raise."""


def check_message_size(request: bytes, what: str) -> None:
    """Raises `MessageTooLargeError` when `request` is over `max_message_bytes()`."""
    limit = max_message_bytes()
    if len(request) > limit:
        raise MessageTooLargeError(
            f"{what} is {len(request)} bytes, over the {limit}-byte gRPC message cap; "
            f"set {MAX_MESSAGE_BYTES_ENV} higher on the controller and the workers if the model needs it")


MAX_MESSAGE_BYTES = max_message_bytes()
# Error details travel in an HTTP/2 trailer; the default 8 KiB metadata limit
# would turn a long XLA error into an unrelated transport error, so the worker
# truncates and both sides accept more.
MAX_ERROR_DETAILS_CHARS = 4000
MAX_METADATA_BYTES = 64 * 1024

# Keepalive pings are the heartbeat of an in-flight call: a peer that stops
# answering them (host gone without a FIN/RST) fails the call after
# KEEPALIVE_TIME_MS + KEEPALIVE_TIMEOUT_MS even before the step deadline.
KEEPALIVE_TIME_MS = 5_000
KEEPALIVE_TIMEOUT_MS = 5_000

CHANNEL_OPTIONS: list[tuple[str, Any]] = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_metadata_size", MAX_METADATA_BYTES),
    ("grpc.keepalive_time_ms", KEEPALIVE_TIME_MS),
    ("grpc.keepalive_timeout_ms", KEEPALIVE_TIMEOUT_MS),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
    # A replaced worker comes back at the same address within seconds; the
    # default reconnect backoff grows to 120 s and would keep it unreachable.
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1_000),
    # Each SliceClient gets its own TCP connection: a dying worker must not
    # share a subchannel with a healthy one.
    ("grpc.use_local_subchannel_pool", 1),
]

SERVER_OPTIONS: list[tuple[str, Any]] = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_metadata_size", MAX_METADATA_BYTES),
    # Accept the client's heartbeat pings instead of answering GOAWAY
    # "too_many_pings".
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.min_recv_ping_interval_without_data_ms", 1_000),
    ("grpc.http2.max_ping_strikes", 0),
    # Linux gRPC sets SO_REUSEPORT by default, letting two workers bind one
    # port and split its traffic; a second bind must fail instead.
    ("grpc.so_reuseport", 0),
]


class WireFormatError(ValueError):
    """Bytes that are not a valid message of this protocol, or an unsupported array."""


def _resolve_dtype(name: str) -> np.dtype:
    """Map a dtype name to a numpy dtype, including ml_dtypes' (bfloat16, float8_*)."""
    extension = getattr(ml_dtypes, name, None)
    try:
        dtype = np.dtype(extension if extension is not None else name)
    except TypeError as error:
        raise WireFormatError(f"unknown dtype {name!r}") from error
    _check_dtype(dtype)
    return dtype


def _check_dtype(dtype: np.dtype) -> None:
    # Numeric kinds only: object/string arrays cannot go to a device, and an
    # object array would need pickle.
    if dtype.kind not in "biufc" and getattr(ml_dtypes, dtype.name, None) is None:
        raise WireFormatError(f"unsupported dtype {dtype} (numeric and ml_dtypes only)")


def _encode_array(array: Any) -> list[Any]:
    array = np.asarray(array)
    _check_dtype(array.dtype)
    if not array.dtype.isnative:
        array = array.astype(array.dtype.newbyteorder("="))
    shape = list(array.shape)  # before ascontiguousarray, which turns 0-d into 1-d
    array = np.ascontiguousarray(array)
    # A uint8 memoryview lets msgpack copy the buffer once, straight into the
    # message, for every dtype (bfloat16 has no buffer-protocol format code).
    raw = memoryview(array.reshape(-1).view(np.uint8))
    return [array.dtype.name, shape, raw]


def _decode_array(item: Any) -> np.ndarray:
    try:
        name, shape, raw = item
        dtype = _resolve_dtype(name)
        shape = tuple(int(dim) for dim in shape)
    except (TypeError, ValueError) as error:
        raise WireFormatError(f"malformed array entry: {error}") from error
    expected = math.prod(shape) * dtype.itemsize
    if not isinstance(raw, bytes):
        raise WireFormatError(f"array {name}{list(shape)}: data is {type(raw).__name__}, not bytes")
    if len(raw) != expected:
        raise WireFormatError(f"array {name}{list(shape)} needs {expected} bytes, got {len(raw)}")
    return np.frombuffer(raw, dtype=dtype).reshape(shape)


def _unpack(data: bytes) -> Any:
    try:
        return msgpack.unpackb(data, raw=False)
    except (ValueError, msgpack.UnpackException) as error:
        raise WireFormatError(f"not a msgpack message: {error}") from error


def pack_arrays(arrays: Sequence[Any]) -> bytes:
    """Serialize a flat list of arrays.

    Args:
      arrays: numpy arrays (or anything `np.asarray` accepts, such as a
        `jax.Array` or a Python scalar) of any shape, including 0-d, with a
        numeric or ml_dtypes dtype (bool, int*, uint*, float*, complex*,
        bfloat16, float8_*).

    Returns:
      The message bytes; about the arrays' total size (`nbytes`) plus a few
      bytes per array.

    Raises:
      WireFormatError: an array has an object, string or structured dtype.
    """
    return msgpack.packb([_encode_array(array) for array in arrays])


def unpack_arrays(data: bytes) -> list[np.ndarray]:
    """Inverse of `pack_arrays`.

    Returns:
      The arrays, with their dtypes and shapes. They are read-only views over
      `data` (no copy); call `.copy()` before writing into one.

    Raises:
      WireFormatError: `data` is not a `pack_arrays` message.
    """
    items = _unpack(data)
    if not isinstance(items, list):
        raise WireFormatError("expected a list of arrays")
    return [_decode_array(item) for item in items]


def pack_load_request(program_hash: str, blob: bytes, compile: bool = False) -> bytes:
    """The `Load` request: a program's hash and its serialized `jax.export.Exported`.

    `compile`: the worker also compiles it before answering (warming a slice
    that does not train yet); without it, the first step compiles.
    """
    message: dict[str, Any] = {"hash": program_hash, "blob": blob}
    if compile:
        message["compile"] = True
    return msgpack.packb(message)


def unpack_load_request(data: bytes) -> tuple[str, bytes, bool]:
    """Inverse of `pack_load_request`: `(program_hash, blob, compile)`. Raises WireFormatError."""
    message = _unpack(data)
    program_hash, blob = _fields(message, "Load", hash=str, blob=bytes)
    compile_flag = message.get("compile", False)  # a map: `_fields` checked
    if not isinstance(compile_flag, bool):
        raise WireFormatError("malformed Load request: 'compile' must be bool")
    return program_hash, blob, compile_flag


def pack_step_request(program_hash: str, arrays: Sequence[Any]) -> bytes:
    """The `Step` request: a program hash and its flat input arrays (see `pack_arrays`)."""
    return msgpack.packb({"hash": program_hash, "arrays": [_encode_array(a) for a in arrays]})


def unpack_step_request(data: bytes) -> tuple[str, list[np.ndarray]]:
    """Inverse of `pack_step_request`: `(program_hash, arrays)`. Raises WireFormatError."""
    program_hash, items = _fields(data, "Step", hash=str, arrays=list)
    return program_hash, [_decode_array(item) for item in items]


def _fields(data: Any, request: str, **types: type) -> tuple[Any, ...]:
    """The values of a msgpack map's keys (`data` packed, or already unpacked), in `types` order, each checked
    against its type."""
    message = _unpack(data) if isinstance(data, (bytes, bytearray, memoryview)) else data
    if not isinstance(message, dict):
        raise WireFormatError(f"malformed {request} request: not a map")
    values = []
    for key, kind in types.items():
        value = message.get(key)
        if not isinstance(value, kind):
            raise WireFormatError(f"malformed {request} request: {key!r} must be {kind.__name__}")
        values.append(value)
    return tuple(values)


def pack_info(info: dict[str, Any]) -> bytes:
    """A small msgpack dict (the `Ping` reply, the `Load` reply)."""
    return msgpack.packb(info)


def unpack_info(data: bytes) -> dict[str, Any]:
    """Inverse of `pack_info`. Raises WireFormatError when `data` is not a msgpack dict."""
    info = _unpack(data)
    if not isinstance(info, dict):
        raise WireFormatError("expected a msgpack map")
    return info
