"""The slice worker's gRPC service: Ping, Load and Step over raw msgpack bytes.

Status codes are the contract with `elastic_jax.controller.slice_client`:

- NOT_FOUND "program <hash> not loaded": the client loads and retries once.
- INVALID_ARGUMENT: a malformed request, a bad program, inputs that do not
  match the program.
- INTERNAL: JAX/XLA failed while compiling or running the program.

- UNAUTHENTICATED: the call lacks the job's bearer token (`wire.auth_metadata`);
  checked by an interceptor before any handler or request parsing, so an
  unauthenticated caller learns nothing (not even Ping's program hashes).

Every error the worker itself reports carries the `wire.ERROR_KIND_KEY`
trailing metadata, so the client can tell "the worker answered with an error"
(user code, not retried forever) from "the worker is unreachable" (slice
down, recoverable); a transport failure never carries it.
"""

from __future__ import annotations

import hmac
import logging
import os
from concurrent import futures
from typing import Iterator, NoReturn

import grpc
import jax

from elastic_jax import wire
from elastic_jax.worker.program_cache import (
    InvalidInputsError,
    InvalidProgramError,
    LoadedProgram,
    ProgramCache,
    ProgramNotLoadedError,
)

log = logging.getLogger(__name__)


def _abort(context: grpc.ServicerContext, code: grpc.StatusCode, message: str) -> NoReturn:
    """End the call with a worker-reported error (see the module docstring)."""
    if len(message) > wire.MAX_ERROR_DETAILS_CHARS:
        message = message[: wire.MAX_ERROR_DETAILS_CHARS] + " …[truncated]"
    context.set_trailing_metadata(((wire.ERROR_KIND_KEY, wire.EXECUTION_ERROR),))
    context.abort(code, message)


class SliceWorkerService:
    """The handlers of one worker process; stateless apart from its program cache.

    Args:
      slice_index: the slice this worker stands in for (reported by Ping, used in logs).
      cache: where loaded programs live.
    """

    def __init__(self, slice_index: int, cache: ProgramCache):
        self.slice_index = slice_index
        self.cache = cache

    def ping(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        """Reply `{slice_index, pid, device_count, program_hashes, compiled_hashes}` (msgpack); ignores the request."""
        return wire.pack_info(
            {
                "slice_index": self.slice_index,
                "pid": os.getpid(),
                "device_count": jax.device_count(),
                "program_hashes": self.cache.hashes(),
                "compiled_hashes": self.cache.compiled_hashes(),
            }
        )

    def load(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        """Cache a program (`wire.pack_load_request`), and compile it when asked; idempotent.

        Replies `{loaded: bool, compiled: bool}` (`loaded`: it was new here;
        `compiled`: it is compiled now, always true when compiling was asked).
        A compile failure is INTERNAL, as when a step compiles it.
        """
        try:
            program_hash, blob, compile_now = wire.unpack_load_request(request)
            loaded = self.cache.load(program_hash, blob)
            program = self.cache.get(program_hash)
        except (wire.WireFormatError, InvalidProgramError) as error:
            log.warning("load rejected", extra={"error": str(error)})
            _abort(context, grpc.StatusCode.INVALID_ARGUMENT, str(error))
        except ProgramNotLoadedError:  # evicted at once by a tiny cache bound: the caller sends it again
            _abort(context, grpc.StatusCode.NOT_FOUND, f"program {program_hash} not loaded")
        if loaded:
            log.info("program loaded", extra={"program_hash": program_hash, "program_bytes": len(blob)})
        if compile_now:
            self._compile(program, "load", context)
        return wire.pack_info({"loaded": loaded, "compiled": program.compiled})

    def _compile(self, program: LoadedProgram, trigger: str, context: grpc.ServicerContext) -> None:
        """Compile `program` once, logging the seconds and what asked for it (`load`: warmed ahead; `step`)."""
        try:
            seconds = program.compile()
        except Exception as error:  # any JAX/XLA failure is the program's, reported as such
            log.exception("compile failed", extra={"program_hash": program.program_hash})
            _abort(context, grpc.StatusCode.INTERNAL, f"{type(error).__name__}: {error}")
        if seconds:
            log.info("program compiled", extra={"program_hash": program.program_hash, "trigger": trigger,
                                                "compile_s": round(seconds, 3)})

    def step(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        """Run a cached program on flat inputs (`wire.pack_step_request`); reply `wire.pack_arrays`."""
        try:
            program_hash, arrays = wire.unpack_step_request(request)
            program = self.cache.get(program_hash)
        except wire.WireFormatError as error:
            _abort(context, grpc.StatusCode.INVALID_ARGUMENT, str(error))
        except ProgramNotLoadedError:
            _abort(context, grpc.StatusCode.NOT_FOUND, f"program {program_hash} not loaded")
        try:
            program.check_inputs(arrays)
        except InvalidInputsError as error:
            _abort(context, grpc.StatusCode.INVALID_ARGUMENT, str(error))
        if not program.compiled:
            self._compile(program, "step", context)
        try:
            outputs = program.run(arrays)
        except InvalidInputsError as error:
            _abort(context, grpc.StatusCode.INVALID_ARGUMENT, str(error))
        except Exception as error:  # any JAX/XLA failure is the program's, reported as such
            log.exception("step failed", extra={"program_hash": program_hash})
            _abort(context, grpc.StatusCode.INTERNAL, f"{type(error).__name__}: {error}")
        return wire.pack_arrays(outputs)


class BearerTokenInterceptor(grpc.ServerInterceptor):
    """Refuses every call whose `authorization` metadata is not `Bearer <token>` (constant-time compare).

    Args:
      token: the job's token (non-empty).

    Raises:
      ValueError: empty token (a worker never serves without one).
    """

    def __init__(self, token: str):
        if not token:
            raise ValueError("a slice worker needs a non-empty token")
        self._expected = f"Bearer {token}".encode()

        def refuse(requests: Iterator[bytes], context: grpc.ServicerContext) -> bytes:
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or invalid bearer token")

        # A stream handler whose request iterator is never read: gRPC asks for no message, so an
        # unauthenticated body is refused before it is read (a unary handler got the whole body first: 4
        # refused calls of 250 MiB took the worker from 801 to 1681 MB). Unary and streaming calls are the
        # same on the wire; HTTP/2 flow control holds the unread rest at the sender.
        self._refusal = grpc.stream_unary_rpc_method_handler(refuse)

    def intercept_service(self, continuation, handler_call_details):
        given = dict(handler_call_details.invocation_metadata or ()).get(wire.AUTH_METADATA_KEY, "")
        if hmac.compare_digest(given.encode() if isinstance(given, str) else given, self._expected):
            return continuation(handler_call_details)
        return self._refusal


def build_server(service: SliceWorkerService, host: str, port: int, token: str,
                 max_workers: int = 4) -> tuple[grpc.Server, int]:
    """Create (not start) a gRPC server for `service` listening on `host:port`.

    Args:
      service: the handlers.
      token: the job's token every call must carry (see `BearerTokenInterceptor`).
      host: interface to bind, e.g. "127.0.0.1".
      port: TCP port; 0 picks a free one.
      max_workers: concurrent calls served (a slow Step does not block Ping).

    Returns:
      `(server, bound_port)`.

    Raises:
      RuntimeError: the address cannot be bound (for example, port in use).
    """
    handlers = {
        wire.PING: grpc.unary_unary_rpc_method_handler(service.ping),
        wire.LOAD: grpc.unary_unary_rpc_method_handler(service.load),
        wire.STEP: grpc.unary_unary_rpc_method_handler(service.step),
    }
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="slice-worker"),
        options=wire.SERVER_OPTIONS,
        interceptors=(BearerTokenInterceptor(token),),
    )
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(wire.SERVICE_NAME, handlers),))
    bound_port = server.add_insecure_port(f"{host}:{port}")
    return server, bound_port
