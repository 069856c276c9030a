"""The controller <-> worker wire format round-trips arrays exactly and rejects garbage."""

from __future__ import annotations

import ml_dtypes
import msgpack
import numpy as np
import pytest

from elastic_jax import wire

ROUND_TRIP_CASES = [
    np.arange(12, dtype=np.float32).reshape(3, 4),
    np.array([-(2**31), 0, 2**31 - 1], dtype=np.int32),
    np.arange(256, dtype=np.uint8),
    np.linspace(-3, 3, 10).astype(ml_dtypes.bfloat16).reshape(2, 5),
    np.array(3.5, dtype=np.float32),  # 0-d
    np.zeros((0, 7), dtype=np.float32),  # empty
    np.array([True, False]),
    np.array([1 + 2j], dtype=np.complex64),
    np.array([1.5, -2.0], dtype=ml_dtypes.float8_e4m3fn),
]


@pytest.mark.parametrize("array", ROUND_TRIP_CASES, ids=lambda a: f"{a.dtype.name}{list(a.shape)}")
def test_arrays_round_trip_bit_exact(array):
    (back,) = wire.unpack_arrays(wire.pack_arrays([array]))
    assert back.dtype == array.dtype
    assert back.shape == array.shape
    assert back.tobytes() == array.tobytes()


def test_many_arrays_keep_order_and_unpacked_arrays_are_read_only():
    arrays = [np.full((2, 2), i, dtype=np.int32) for i in range(5)]
    back = wire.unpack_arrays(wire.pack_arrays(arrays))
    assert [int(a[0, 0]) for a in back] == list(range(5))
    with pytest.raises(ValueError):
        back[0][0, 0] = 9  # zero-copy views; documented as read-only


def test_non_contiguous_big_endian_and_scalar_inputs_are_normalized():
    strided = np.arange(20, dtype=np.float32).reshape(4, 5)[:, ::2]
    big_endian = np.arange(4, dtype=">i4")
    back = wire.unpack_arrays(wire.pack_arrays([strided, big_endian, 7]))
    np.testing.assert_array_equal(back[0], strided)
    np.testing.assert_array_equal(back[1], big_endian)
    assert back[1].dtype == np.int32 and back[1].dtype.isnative
    assert back[2].shape == () and int(back[2]) == 7


def test_payload_overhead_is_a_few_bytes_per_array():
    array = np.zeros((1024, 1024), dtype=np.float32)  # 4 MiB
    assert len(wire.pack_arrays([array])) - array.nbytes < 64


def test_step_and_load_requests_round_trip():
    arrays = [np.ones(3, np.float32), np.array(2, np.int32)]
    program_hash, back = wire.unpack_step_request(wire.pack_step_request("abc", arrays))
    assert program_hash == "abc"
    assert [a.tolist() for a in back] == [[1.0, 1.0, 1.0], 2]
    assert wire.unpack_load_request(wire.pack_load_request("h", b"\x00blob")) == ("h", b"\x00blob", False)
    assert wire.unpack_load_request(wire.pack_load_request("h", b"b", compile=True)) == ("h", b"b", True)
    assert wire.unpack_info(wire.pack_info({"pid": 1, "program_hashes": ["h"]})) == {"pid": 1, "program_hashes": ["h"]}


@pytest.mark.parametrize("array", [np.array(["a"]), np.array([object()], dtype=object)])
def test_non_numeric_dtypes_are_refused(array):
    with pytest.raises(wire.WireFormatError, match="unsupported dtype"):
        wire.pack_arrays([array])


@pytest.mark.parametrize(
    "data, match",
    [
        (b"\xc1", "not a msgpack"),
        (msgpack.packb({"a": 1}), "list of arrays"),
        (msgpack.packb([["float32", [2], b"\x00" * 4]]), "needs 8 bytes"),
        (msgpack.packb([["object", [1], b"\x00" * 8]]), "unsupported dtype"),
        (msgpack.packb([["no_such_dtype", [1], b"\x00"]]), "dtype"),
        (msgpack.packb([["float32", [1]]]), "malformed"),
    ],
)
def test_malformed_messages_raise_wire_format_error(data, match):
    with pytest.raises(wire.WireFormatError, match=match):
        wire.unpack_arrays(data)


def test_malformed_requests_raise_wire_format_error():
    with pytest.raises(wire.WireFormatError):
        wire.unpack_step_request(msgpack.packb({"hash": 1, "arrays": []}))
    with pytest.raises(wire.WireFormatError):
        wire.unpack_load_request(msgpack.packb(["h", b""]))
    with pytest.raises(wire.WireFormatError, match="'compile' must be bool"):
        wire.unpack_load_request(msgpack.packb({"hash": "h", "blob": b"", "compile": "yes"}))


def test_method_paths_and_size_limits():
    assert wire.method_path(wire.STEP) == "/elastic_jax.SliceWorker/Step"
    for options in (wire.CHANNEL_OPTIONS, wire.SERVER_OPTIONS):
        limits = dict(options)
        # Bounded (issue 9, item 14: it was 2 GiB), and the same cap on both ends.
        assert limits["grpc.max_receive_message_length"] == wire.MAX_MESSAGE_BYTES == wire.DEFAULT_MAX_MESSAGE_BYTES
        assert limits["grpc.max_send_message_length"] == wire.MAX_MESSAGE_BYTES


def test_message_cap_is_configurable_and_refuses_nonsense(monkeypatch):
    monkeypatch.setenv(wire.MAX_MESSAGE_BYTES_ENV, str(2**20))
    assert wire.max_message_bytes() == 2**20
    with pytest.raises(wire.MessageTooLargeError, match="over the 1048576-byte"):
        wire.check_message_size(b"x" * (2**20 + 1), "a test request")
    wire.check_message_size(b"x" * 2**20, "a test request")
    monkeypatch.setenv(wire.MAX_MESSAGE_BYTES_ENV, "lots")
    with pytest.raises(ValueError, match="positive number"):
        wire.max_message_bytes()
