"""`elastic-jax-worker`: run one CPU slice worker until SIGTERM/SIGINT.

    elastic-jax-worker --host 127.0.0.1 --port 50051 --slice-index 0 --host-devices 2 --token-file TOKEN

Every call must carry the job's token (`--token-file`, else the file named by
`ELASTIC_JAX_TOKEN_FILE`, as the operator mounts it); without one the worker
does not start. The program cache holds at most `--cache-bytes` of programs
(least recently used evicted first); messages are capped by
`ELASTIC_JAX_MAX_MESSAGE_BYTES` (`elastic_jax.wire`).

The host device count must be fixed before jax is imported, so this module
imports jax (through `server`) only inside `main()`. Logs go to stderr, JSON lines
by default (`--log-format`, env `ELASTIC_JAX_LOG_FORMAT`: json or text, as the
controller and the operator take it); the line `serving` carries the bound address.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Sequence

from elastic_jax import contract
from elastic_jax.logs import FORMATS, JsonFormatter, TextFormatter, log_format

# Seconds in-flight calls get to finish after SIGTERM; Kubernetes' default
# grace period is 30 s, a step is far shorter.
STOP_GRACE_S = 5.0

def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Parse the worker's command line (see the module docstring)."""
    parser = argparse.ArgumentParser(prog="elastic-jax-worker", description="CPU slice worker for elastic-jax")
    parser.add_argument("--host", default="127.0.0.1", help="interface to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=0, help="TCP port; 0 picks a free one (default 0)")
    parser.add_argument("--slice-index", type=int, default=0, help="the slice this worker stands in for")
    parser.add_argument(
        "--host-devices", type=int, default=1, help="JAX CPU devices in this process (a slice's chips)"
    )
    parser.add_argument("--token-file", default=os.environ.get(contract.ENV_TOKEN_FILE),
                        help="file holding the job's token (default: $ELASTIC_JAX_TOKEN_FILE)")
    parser.add_argument("--cache-bytes", type=int, default=1 << 30,
                        help="program cache bound in serialized bytes (default 1 GiB)")
    parser.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    # (a string default goes through `type`: a bad ELASTIC_JAX_LOG_FORMAT is a usage error, as in the other images)
    parser.add_argument("--log-format", type=log_format, default=os.environ.get(contract.ENV_LOG_FORMAT, "json"),
                        help=f"{' or '.join(FORMATS)} (env ELASTIC_JAX_LOG_FORMAT)")
    args = parser.parse_args(argv)
    if not args.token_file:
        parser.error("no token: pass --token-file or set ELASTIC_JAX_TOKEN_FILE (a worker never serves without one)")
    if args.host_devices < 1:
        parser.error("--host-devices must be at least 1")
    if not 0 <= args.port <= 65535:
        parser.error(f"--port {args.port}: must be 0..65535 (0 picks a free port)")
    if args.slice_index < 0:
        parser.error(f"--slice-index {args.slice_index}: must be 0 or more")
    if args.cache_bytes < 1:
        parser.error(f"--cache-bytes {args.cache_bytes}: must be at least 1")
    return args


def _configure_jax_env(host_devices: int) -> None:
    """Pin JAX to the CPU backend with `host_devices` devices; call before importing jax."""
    os.environ["JAX_PLATFORMS"] = "cpu"
    flags = [f for f in os.environ.get("XLA_FLAGS", "").split() if not f.startswith("--xla_force_host_platform_device_count")]
    flags.append(f"--xla_force_host_platform_device_count={host_devices}")
    os.environ["XLA_FLAGS"] = " ".join(flags)


def main(argv: Sequence[str] | None = None) -> int:
    """Serve until SIGTERM or SIGINT, then stop gracefully.

    Returns:
      The process exit code: 128 + the signal number after a signal-initiated
      stop (143 for SIGTERM, the shell's convention), 1 when the address
      cannot be bound. Never 0: a slice worker serves until the job ends it,
      so stopping is never its success. A pod deleted gracefully (a drain, GKE
      maintenance, `kubectl delete pod`) must fail its Job so the JobSet
      replaces the slice; with exit 0 the Job would be Complete and the slice
      lost for good.
    """
    args = parse_args(argv)
    _configure_jax_env(args.host_devices)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter({"slice_index": args.slice_index, "pid": os.getpid()})
                         if args.log_format == "json" else TextFormatter())
    logging.basicConfig(level=args.log_level, handlers=[handler], force=True)
    log = logging.getLogger("elastic_jax.worker")

    # Imported here, after the environment is set: importing jax fixes the
    # device count.
    import jax

    from elastic_jax.worker.program_cache import ProgramCache
    from elastic_jax.worker.server import SliceWorkerService, build_server

    try:
        token = open(args.token_file).read().strip()
    except OSError as error:
        log.error("cannot read the token file", extra={"path": args.token_file, "error": error.strerror})
        return 2
    if not token:
        log.error("empty token file", extra={"path": args.token_file})
        return 2
    started = time.monotonic()
    try:
        server, port = build_server(SliceWorkerService(args.slice_index, ProgramCache(max_bytes=args.cache_bytes)),
                                    args.host, args.port, token)
    except RuntimeError as error:
        log.error("cannot bind", extra={"address": f"{args.host}:{args.port}", "error": str(error)})
        return 1
    stop = threading.Event()
    received: list[int] = []
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda signum, _frame: (received.append(signum), stop.set()))
    server.start()
    log.info(
        "serving",
        extra={
            "address": f"{args.host}:{port}",
            "device_count": jax.device_count(),
            "startup_s": round(time.monotonic() - started, 3),
        },
    )
    # Wait in short slices so the main thread returns to the interpreter and
    # runs the signal handler promptly.
    while not stop.wait(0.5):
        pass
    log.info("stopping", extra={"grace_s": STOP_GRACE_S})
    server.stop(STOP_GRACE_S).wait()
    log.info("stopped")
    return 128 + received[0]


if __name__ == "__main__":
    sys.exit(main())
