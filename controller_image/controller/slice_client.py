"""The controller's handle on one CPU slice worker (the `cpu` backend's transport).

A per-slice step is lowered once with `jax.export` (`export_program`), sent
to the worker once (`load_program`, cached there by hash), and then each step
ships only flat input arrays and gets flat output arrays back
(`step_async`). Every failure is translated into the two error classes the
elastic manager understands:

- `SliceDownError(cause="slice_down")`: the worker is unreachable or went
  away (refused connection, reset, cancelled, any transport error);
  `cause="step_deadline"`: it did not answer within the deadline (a hang).
- `SliceExecutionError`: the worker answered, but the program failed there
  (the user-code class: the same error on every slice is not retried).
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import grpc
import jax
import numpy as np

from elastic_jax import wire
from elastic_jax.controller.elastic.errors import SliceDownError, SliceExecutionError


@dataclass(frozen=True)
class StepProgram:
    """A serialized per-slice step program.

    Attributes:
      hash: sha256 hex digest of `blob`; the worker's cache key.
      blob: `jax.export.Exported.serialize()` bytes.
      input_count: number of flat input arrays a step takes.
    """

    hash: str
    blob: bytes
    input_count: int


def export_program(fn_jitted: Callable[..., Any], *example_args: Any) -> StepProgram:
    """Lower a jitted function with `jax.export` and serialize it.

    Args:
      fn_jitted: a `jax.jit`-wrapped function. Its shardings decide how a
        worker lays inputs over its host devices: for a D-device slice, use
        NamedShardings over a D-device mesh (a `jax.sharding.AbstractMesh`
        works in a process with fewer devices).
      *example_args: arrays or `jax.ShapeDtypeStruct` pytrees with the step's
        shapes and dtypes. A step later takes `jax.tree.leaves(example_args)`
        flattened the same way.

    Returns:
      The program; exporting a small step takes tens of milliseconds.

    Raises:
      Whatever `jax.export.export` raises for an unexportable function.
    """
    return program_from_exported(jax.export.export(fn_jitted)(*example_args))


def program_from_exported(exported: jax.export.Exported) -> StepProgram:
    """Serialize an already exported function (for `jax.export.export` options
    such as `platforms=`); `export_program` is the usual way in."""
    blob = bytes(exported.serialize())
    return StepProgram(hashlib.sha256(blob).hexdigest(), blob, exported.in_tree.num_leaves)


class SliceClient:
    """RPC client for the worker of one slice.

    Calls never wait for a worker to become reachable (`wait_for_ready` is
    off), so a dead worker fails a call immediately, not at its deadline.
    Thread-safe; one gRPC channel (one TCP connection) per client.

    Args:
      slice_index: the slice this worker serves (stamped on errors).
      address: "host:port" of the worker.
      token: the job's token, sent with every call (the worker refuses calls without it).
    """

    def __init__(self, slice_index: int, address: str, token: str):
        self.slice_index = slice_index
        self.address = address
        self._channel = grpc.insecure_channel(address, options=wire.CHANNEL_OPTIONS)
        metadata = wire.auth_metadata(token)
        self._ping = _WithMetadata(self._channel.unary_unary(wire.method_path(wire.PING)), metadata)
        self._load = _WithMetadata(self._channel.unary_unary(wire.method_path(wire.LOAD)), metadata)
        self._step = _WithMetadata(self._channel.unary_unary(wire.method_path(wire.STEP)), metadata)

    def ping(self, timeout_s: float = 2.0) -> dict[str, Any]:
        """Ask the worker who it is.

        Returns:
          `{"slice_index": int, "pid": int, "device_count": int,
          "program_hashes": list[str], "compiled_hashes": list[str]}`.

        Raises:
          SliceDownError: unreachable, or no answer within `timeout_s` seconds.
        """
        try:
            return wire.unpack_info(self._ping(b"", timeout=timeout_s, wait_for_ready=False))
        except grpc.RpcError as error:
            raise self._translate(error) from None
        except (ValueError, wire.WireFormatError) as error:  # closed channel, garbage reply
            raise self._down(error) from None

    def load_program(self, program: StepProgram, timeout_s: float = 30.0, compile: bool = False) -> None:
        """Send `program` to the worker's cache (idempotent; a no-op when cached).

        Args:
          program: the step program.
          timeout_s: seconds for the whole call, compiling included.
          compile: also compile it there before answering (warms a slice
            that does not train yet, so its first step does not compile).

        Raises:
          SliceDownError: unreachable, or no answer within `timeout_s` seconds.
          SliceExecutionError: the worker rejected the program (bad bytes, or
            it needs more devices than the worker has), or compiling it failed.
        """
        request = wire.pack_load_request(program.hash, program.blob, compile=compile)
        wire.check_message_size(request, f"program {program.hash[:12]}")
        try:
            self._load(request, timeout=timeout_s, wait_for_ready=False)
        except grpc.RpcError as error:
            raise self._translate(error) from None
        except ValueError as error:  # grpc refuses calls on a closed channel
            raise self._down(error) from None

    def step_async(
        self, program: StepProgram, args: Sequence[np.ndarray], timeout_s: float
    ) -> concurrent.futures.Future[list[np.ndarray]]:
        """Run one step on the worker without blocking.

        When the worker does not hold the program (it restarted), the program
        is loaded and the step retried once, within the same deadline.

        Args:
          program: the step program (loaded beforehand or not).
          args: `program.input_count` flat input arrays (numpy or anything
            `np.asarray` takes), shapes/dtypes as exported.
          timeout_s: deadline in seconds for the whole step, including a reload.

        Returns:
          A future of the flat output arrays (read-only numpy views; see
          `wire.unpack_arrays`). Its exception is `SliceDownError` (cause
          "slice_down" or "step_deadline") or `SliceExecutionError`.
          Cancelling the future cancels the RPC.

        Raises:
          ValueError: `len(args) != program.input_count` (a caller bug).
          WireFormatError: an argument has an unsupported dtype.
          MessageTooLargeError: the request is over `wire.max_message_bytes()`.
        """
        if len(args) != program.input_count:
            raise ValueError(f"program takes {program.input_count} inputs, got {len(args)}")
        request = wire.pack_step_request(program.hash, args)
        wire.check_message_size(request, f"the step request for slice {self.slice_index}")
        return _StepCall(self, program, request, time.monotonic() + timeout_s).result

    def close(self) -> None:
        """Close the channel; in-flight calls fail with SliceDownError."""
        self._channel.close()

    def __enter__(self) -> SliceClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _translate(self, error: grpc.RpcError) -> Exception:
        """Map a failed call to SliceDownError or SliceExecutionError (see the module docstring)."""
        code, details = error.code(), error.details() or ""
        trailing = dict(error.trailing_metadata() or ())
        if trailing.get(wire.ERROR_KIND_KEY) == wire.EXECUTION_ERROR:
            return SliceExecutionError(self.slice_index, details)
        if code == grpc.StatusCode.DEADLINE_EXCEEDED:
            return SliceDownError(
                f"slice {self.slice_index} ({self.address}) missed its deadline: {details}",
                [self.slice_index],
                cause="step_deadline",
            )
        return self._down(f"{code.name}: {details}")

    def _down(self, reason: object) -> SliceDownError:
        return SliceDownError(
            f"slice {self.slice_index} ({self.address}) unreachable: {reason}", [self.slice_index], cause="slice_down"
        )


class _StepCall:
    """One `step_async` in flight: step, and on NOT_FOUND load then step again.

    Chained through gRPC done-callbacks, so no thread blocks while waiting.
    """

    def __init__(self, client: SliceClient, program: StepProgram, request: bytes, deadline: float):
        self._client = client
        self._program = program
        self._request = request
        self._deadline = deadline
        self._lock = threading.Lock()
        self._call: grpc.Future | None = None
        self.result: concurrent.futures.Future[list[np.ndarray]] = concurrent.futures.Future()
        self.result.add_done_callback(self._cancel_call_if_cancelled)
        self._start(self._client._step, request, self._on_step, may_reload=True)

    def _start(self, stub: grpc.UnaryUnaryMultiCallable, request: bytes, on_done: Callable, **kwargs: Any) -> None:
        remaining_s = self._deadline - time.monotonic()
        if remaining_s <= 0:
            self._fail(grpc.StatusCode.DEADLINE_EXCEEDED, "deadline passed before the retry")
            return
        with self._lock:
            if self.result.done():  # cancelled by the caller meanwhile
                return
            try:
                call = self._call = stub.future(request, timeout=remaining_s, wait_for_ready=False)
            except ValueError as error:  # grpc refuses calls on a closed channel
                call, refusal = None, str(error)
        if call is None:
            self._fail(grpc.StatusCode.CANCELLED, refusal)
        else:
            call.add_done_callback(lambda done: on_done(done, **kwargs))

    def _on_step(self, call: grpc.Future, may_reload: bool) -> None:
        error = call.exception() if not call.cancelled() else None
        if error is None and not call.cancelled():
            self._settle(lambda: self.result.set_result(wire.unpack_arrays(call.result())))
        elif may_reload and error is not None and error.code() == grpc.StatusCode.NOT_FOUND:
            load_request = wire.pack_load_request(self._program.hash, self._program.blob)
            self._start(self._client._load, load_request, self._on_load)
        else:
            self._fail_with(call)

    def _on_load(self, call: grpc.Future) -> None:
        if call.cancelled() or call.exception() is not None:
            self._fail_with(call)
        else:
            self._start(self._client._step, self._request, self._on_step, may_reload=False)

    def _fail_with(self, call: grpc.Future) -> None:
        if call.cancelled():
            self._fail(grpc.StatusCode.CANCELLED, "call cancelled")
        else:
            self._settle(lambda: self.result.set_exception(self._client._translate(call.exception())))

    def _fail(self, code: grpc.StatusCode, details: str) -> None:
        self._settle(lambda: self.result.set_exception(self._client._translate(_LocalRpcError(code, details))))

    def _settle(self, set_outcome: Callable[[], None]) -> None:
        try:
            set_outcome()
        except concurrent.futures.InvalidStateError:
            pass  # the caller cancelled the future first; nobody wants the outcome
        except wire.WireFormatError as error:
            # A worker that answers garbage is as good as lost.
            self._fail(grpc.StatusCode.DATA_LOSS, f"malformed reply: {error}")

    def _cancel_call_if_cancelled(self, result: concurrent.futures.Future) -> None:
        if result.cancelled():
            with self._lock:
                call = self._call
            if call is not None:
                call.cancel()


class _WithMetadata:
    """A unary-unary stub that adds fixed call metadata (the bearer token) to every call."""

    def __init__(self, stub: grpc.UnaryUnaryMultiCallable, metadata: tuple[tuple[str, str], ...]):
        self._stub = stub
        self._metadata = metadata

    def __call__(self, request: bytes, **kwargs: Any) -> bytes:
        return self._stub(request, metadata=self._metadata, **kwargs)

    def future(self, request: bytes, **kwargs: Any) -> grpc.Future:
        return self._stub.future(request, metadata=self._metadata, **kwargs)


class _LocalRpcError(grpc.RpcError):
    """A failure decided on this side (deadline spent before a retry), shaped like a gRPC error."""

    def __init__(self, code: grpc.StatusCode, details: str):
        super().__init__(details)
        self._code, self._details = code, details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details

    def trailing_metadata(self) -> tuple:
        return ()
