"""The cpu backend: runs each slice's share of a step on a CPU slice worker.

The controller keeps the authoritative training state. Each step it cuts the
global batch into one fixed-size chunk per desired slice, sends each chunk
and the current parameters to an active slice (round robin, so with fewer
slices some run two chunks), and adds up what each chunk returns: data
parallelism over slices, as DCN does across TPU slices. `map_sum` is that
primitive for any per-slice function: the library's `Runtime.map_sum` calls
it, and so does the built-in trainer, through its `Runtime`, with the
`Trainer.loss_fn` step (`make_slice_step`, returning `(loss_sum, weight,
grads_sum)`). A per-slice function is lowered once per
per-slice batch shape with `jax.export`; workers cache it by hash.

Failure classification (docs/failure-handling.md, flows 1, 5, 6):
* a refused/lost connection or a Down report for a slice in flight:
  `SliceDownError(cause="slice_down")` right away, without waiting for the
  other slices;
* no answer within the step deadline: `SliceDownError(cause="step_deadline")`
  for the slices that did not answer; but when every active slice (two or
  more) missed it and none answered, the deadline is too short for the step,
  not a sign of hung slices: no slice is marked down, the step's calls run on
  with the deadline doubled (`CpuBackend.extensions_allowed` times at most:
  twice, or until it reaches `firstStepDeadlineSeconds`), the run
  keeps the longer deadline, and a warning naming
  `spec.elasticity.stepDeadlineSeconds` and the observed step time goes to
  the log and `/v1/status` (`settingWarnings`);
* a worker that answered with an execution error: when *every* slice of the
  step reports the same error it is the program's fault, `UserCodeError`,
  never retried; otherwise those slices count as down.
"""

from __future__ import annotations

import concurrent.futures
import logging
import queue
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import jax
import numpy as np

from elastic_jax.controller.elastic.errors import SliceDownError, SliceExecutionError, StopRequested, UserCodeError
from elastic_jax.controller.elastic.slice_set import SliceSet
from elastic_jax.controller.slice_client import SliceClient, StepProgram, export_program
from elastic_jax.controller.stall_clock import GAP_S, StallClock
from elastic_jax.controller.trainer import Trainer

_logger = logging.getLogger(__name__)

STALL_RESENDS = 3
"""Times a step is sent again after a deadline this process's own stall explains (then the slices are blamed)."""

DEADLINE_EXTENSIONS = 2
"""Least times a step's deadline is doubled while every active slice (two or more) has missed it and none answered:
the step itself is slower than `spec.elasticity.stepDeadlineSeconds`, not a slice fault (docs/failure-handling.md).
The step's calls run on meanwhile (nothing is sent again). More doublings are allowed up to
`firstStepDeadlineSeconds` (`CpuBackend.extensions_allowed`); past that no answer is a hang again."""

DEADLINE_FIELD = "spec.elasticity.stepDeadlineSeconds"


def split_sizes(global_batch_size: int, slice_count: int) -> list[int]:
    """Per-slice batch sizes for a global batch: even split, remainder to the lowest slices.

    Example: 24 over 3 -> [8, 8, 8]; 25 over 3 -> [9, 8, 8].

    Raises:
      ValueError: fewer examples than slices (a slice would get an empty batch).
    """
    if slice_count < 1:
        raise ValueError("slice_count must be >= 1")
    if global_batch_size < slice_count:
        raise ValueError(f"global batch {global_batch_size} is smaller than the {slice_count} active slices")
    base, extra = divmod(global_batch_size, slice_count)
    return [base + (1 if r < extra else 0) for r in range(slice_count)]


def make_slice_step(trainer: Trainer):
    """The per-slice step `(params, batch) -> (loss_sum f32[], weight f32[], grads_sum)` (not jitted)."""

    def slice_step(params, batch):
        (loss_sum, weight), grads = jax.value_and_grad(trainer.loss_fn, has_aux=True)(params, batch)
        return loss_sum, weight, grads

    return slice_step


class CpuBackend:
    """Runs the per-slice step on CPU slice workers over gRPC.

    Args:
      slice_set: slice addresses and states (fed by the control API).
      devices_per_host: host devices per worker (`--xla_force_host_platform_device_count`);
        the per-slice batch is sharded across them when it divides evenly.
      step_deadline_s: seconds a slice may take for a step before it counts as hung.
      token: the job's token, sent with every call to a worker.
      first_step_deadline_s: the same for the first step of a program on a
        slice, which includes deserializing and compiling it there.
    """

    def __init__(
        self,
        slice_set: SliceSet,
        devices_per_host: int = 1,
        step_deadline_s: float = 60.0,
        first_step_deadline_s: float = 120.0,
        token: str = "",
    ):
        self.token = token
        self.slice_set = slice_set
        self.devices_per_host = devices_per_host
        self.step_deadline_s = step_deadline_s
        self.first_step_deadline_s = first_step_deadline_s
        # (function, shapes) -> (program, the function's output tree: how the summed leaves are rebuilt)
        self._programs: dict[Any, tuple[StepProgram, Any]] = {}
        self._clients: dict[int, tuple[int, tuple[str, ...], SliceClient]] = {}
        self._warm: set[tuple[int, int, str]] = set()  # (slice, generation, program hash) already compiled there
        # Warming idle slices (`prepare`): (slice, generation) -> the warm-up in flight, and when a failed one
        # may be tried again (monotonic seconds).
        self._warming: dict[tuple[int, int], concurrent.futures.Future] = {}
        self._warm_retry_at: dict[tuple[int, int], float] = {}
        self._warmer = concurrent.futures.ThreadPoolExecutor(max_workers=2, thread_name_prefix="warm-slice")
        self._lock = threading.Lock()
        self._events: queue.Queue | None = None  # the in-flight step's, for `interrupt`
        self._interrupted = threading.Event()
        self._stalls = StallClock().start()  # this process's own stalls: they excuse a missed step deadline
        self.configured_step_deadline_s = step_deadline_s
        self.setting_warnings: list[str] = []  # what the run found wrong with its settings (`/v1/status`)

    # -- slices ------------------------------------------------------------

    def _client(self, index: int) -> tuple[SliceClient, int]:
        addresses, generation = self.slice_set.addresses(index)
        with self._lock:
            cached = self._clients.get(index)
            if cached is not None and cached[0] == generation and cached[1] == addresses:
                return cached[2], generation
            if cached is not None:
                cached[2].close()
            if not addresses:
                raise SliceDownError(f"slice {index} has no worker address", [index])
            client = SliceClient(index, addresses[0], self.token)
            self._clients[index] = (generation, addresses, client)
            return client, generation

    def health_check(self, indices: Iterable[int], timeout_s: float = 5.0) -> frozenset[int]:
        """Pings the slices concurrently; returns those that answered within `timeout_s` seconds.

        A ping whose deadline expired while this process itself was stalled (as for a step: `map_sum`)
        blames no slice: it is sent again, at most `STALL_RESENDS` times. The manager health-checks every
        Ready slice at each attempt, the active ones too, and marks the ones that fail Down (a supervisor
        then replaces their workers): before, a controller starved or frozen across the ping of the attempt
        that scales up had a healthy surviving slice replaced."""
        indices = sorted(indices)
        healthy = set()
        futures = {}
        with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, len(indices))) as pool:
            for i in indices:
                futures[pool.submit(self._ping, i, timeout_s)] = i
            for fut in concurrent.futures.as_completed(futures):
                if fut.result():
                    healthy.add(futures[fut])
        return frozenset(healthy)

    def _ping(self, index: int, timeout_s: float) -> bool:
        for resend in range(STALL_RESENDS + 1):
            sent = time.monotonic()
            try:
                client, _ = self._client(index)
                client.ping(timeout_s)
                return True
            except SliceDownError as e:
                elapsed = time.monotonic() - sent
                stalled = self._stalls.stalled_seconds(sent)
                # the step path's rule: only a stall long enough to have eaten the deadline excuses it
                if (e.cause == "step_deadline" and resend < STALL_RESENDS and stalled >= GAP_S
                        and elapsed - stalled < timeout_s):
                    _logger.warning(
                        "health check of slice %d expired while the controller itself was stalled for %.1f of "
                        "the %.1f s since the ping was sent: not blamed, pinged again", index, stalled, elapsed,
                        extra={"event": "controller_stalled", "stalled_s": round(stalled, 3), "slices": [index]})
                    continue
                _logger.info("slice %d failed health check: %s", index, e)
                return False
            except Exception as e:  # noqa: BLE001 - any failure means not healthy
                _logger.info("slice %d failed health check: %s", index, e)
                return False
        return False

    # -- warming idle slices -------------------------------------------------

    WARM_RETRY_S = 2.0
    """Seconds before a failed warm-up of the same worker is tried again (it is probably going Down)."""

    def prepare(self, indices: Iterable[int]) -> frozenset[int]:
        """The slices of `indices` that can join the mesh without compiling; warms the others in the background.

        A slice that does not train (a hot spare, or a replaced slice back
        Ready) is sent every step program this controller has exported, and
        compiles them there (`SliceClient.load_program(compile=True)`), while
        the active slices keep training. The manager swaps in or scales up
        only onto prepared slices, so a join costs no step a compile long.
        Before the first step there is no program yet: every slice is prepared.
        A failed warm-up (worker gone, compile error) is logged and tried
        again after `WARM_RETRY_S` seconds; a slice whose worker is lost is
        marked down by its health check or its first step, as before.

        Args:
          indices: Ready slices outside the active set.

        Returns:
          Those whose current worker (generation) has compiled every program.
        """
        with self._lock:
            programs = [program for program, _ in self._programs.values()]
        prepared = set()
        now = time.monotonic()
        for index in sorted(set(indices)):
            _, generation = self.slice_set.addresses(index)
            missing = [p for p in programs if (index, generation, p.hash) not in self._warm]
            if not missing:
                prepared.add(index)
                continue
            key = (index, generation)
            with self._lock:
                if key in self._warming or now < self._warm_retry_at.get(key, 0.0):
                    continue
                self._warming[key] = self._warmer.submit(self._warm_slice, index, generation, missing)
        return frozenset(prepared)

    def _warm_slice(self, index: int, generation: int, programs: Sequence[StepProgram]) -> None:
        """Loads and compiles `programs` on one slice's worker (runs on the warming thread)."""
        key = (index, generation)
        t0 = time.monotonic()
        try:
            client, current = self._client(index)
            if current != generation:
                return  # replaced meanwhile; the next `prepare` warms the new worker
            for program in programs:
                client.load_program(program, timeout_s=self.first_step_deadline_s, compile=True)
                self._warm.add((index, generation, program.hash))
            _logger.info("slice %d warmed: %d program(s) compiled there in %.2f s", index, len(programs),
                         time.monotonic() - t0, extra={"event": "slice_warmed", "slice": index,
                                                        "seconds": round(time.monotonic() - t0, 3)})
        except Exception as e:  # noqa: BLE001 - a warm-up is an optimization; the step path handles the failure
            _logger.info("warming slice %d failed: %s", index, e)
            with self._lock:
                self._warm_retry_at[key] = time.monotonic() + self.WARM_RETRY_S
        finally:
            with self._lock:
                self._warming.pop(key, None)

    # -- programs ----------------------------------------------------------

    def _sharding_for(self, per_slice_batch: int):
        """Shardings for (params, batch): batch split across the host's devices when it divides."""
        d = self.devices_per_host
        if d <= 1 or per_slice_batch % d != 0 or len(jax.devices()) < d:
            return None
        mesh = jax.sharding.Mesh(np.array(jax.devices()[:d]), ("data",))
        replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
        batch_sharded = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data"))
        return replicated, batch_sharded

    def _program_and_tree(self, fn: Any, params: Any, batch: Mapping[str, np.ndarray]) -> tuple[StepProgram, Any]:
        key = (
            fn,
            jax.tree_util.tree_structure(params),
            tuple((tuple(x.shape), str(x.dtype)) for x in jax.tree_util.tree_leaves(params)),
            tuple((k, tuple(v.shape), str(v.dtype)) for k, v in sorted(batch.items())),
        )
        cached = self._programs.get(key)
        if cached is not None:
            return cached
        params_spec = jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), params)
        batch_spec = {k: jax.ShapeDtypeStruct(v.shape, v.dtype) for k, v in batch.items()}
        shardings = self._sharding_for(next(iter(batch.values())).shape[0])
        if shardings is None:
            jitted = jax.jit(fn)
        else:
            replicated, batch_sharded = shardings
            jitted = jax.jit(
                fn,
                in_shardings=(
                    jax.tree_util.tree_map(lambda _: replicated, params_spec),
                    {k: batch_sharded for k in batch_spec},
                ),
            )
        program = export_program(jitted, params_spec, batch_spec)
        out_tree = jax.tree_util.tree_structure(jax.eval_shape(fn, params_spec, batch_spec))
        with self._lock:
            self._programs[key] = (program, out_tree)
        # The Ready slices outside the mesh (hot spares, a slice waiting to join) have not compiled this new
        # program: warm them now, beside the step, and say so. Before, the manager's next step boundary did,
        # so a spare read a plain, warm-looking `Spare` through the first step (session 12's trial).
        idle = self.slice_set.ready() - self.slice_set.active
        if idle:
            self.slice_set.set_warming(idle - self.prepare(idle))
        return program, out_tree

    # -- the step ----------------------------------------------------------

    def map_sum(self, fn: Any, params: Any, batch: Mapping[str, np.ndarray], active: Sequence[int]) -> Any:
        """Runs `fn(params, chunk)` for each chunk of the global `batch` on the active slices; returns the sum.

        The global batch is cut into `slice_set.count` fixed-size chunks (one
        per desired slice, `split_sizes`), and chunk j runs on active slice
        `active[j % len(active)]`. With all slices up each slice runs one
        chunk; with fewer, some run two. Chunk shapes never change, so a
        replica resize reuses the programs every worker already compiled
        instead of compiling new ones in the middle of a recovery.

        Args:
          fn: the per-slice function `(params, chunk) -> pytree of arrays`,
            traceable by `jax.jit` (pure; no Python side effects). Its outputs
            are added leaf by leaf over the chunks, so return sums, not means
            (e.g. a loss summed over the chunk's examples and the example
            count). Lowered once per chunk shape and cached by `fn` identity:
            pass the same function object every step.
          params: the parameter pytree (jax or numpy arrays).
          batch: the global batch, dict of arrays with leading axis = global
            batch size (at least `slice_set.count` examples).
          active: active slice indices.

        Returns:
          `fn`'s output tree with numpy leaves: the sum over all chunks.

        Raises:
          SliceDownError: a slice of `active` was lost, hung past its deadline,
            or the operator reported it Down during the step or before it
            (a slice of `active` no longer in `slice_set.active` is not sent the step). A deadline that
            expired while this process itself was stalled (SIGSTOP, a frozen
            VM or cgroup, CPU starvation: `stall_clock`) blames no slice: the
            step is sent again, at most `STALL_RESENDS` times.
          UserCodeError: every slice failed running the program with the same error.
        """
        active = sorted(active)
        if not active:
            raise SliceDownError("no active slices", [])
        for resend in range(STALL_RESENDS + 1):
            try:
                return self._map_sum_once(fn, params, batch, active)
            except SliceDownError as error:
                if error.cause != "step_deadline" or error.deadline_s is None:
                    raise
                elapsed = time.monotonic() - error.failed_since
                stalled = self._stalls.stalled_seconds(error.failed_since)
                # Excused only by a stall long enough to have eaten the slice's deadline: without one, or
                # with the slice silent for a whole deadline of running time anyway, it is a hang.
                if resend == STALL_RESENDS or stalled < GAP_S or elapsed - stalled >= error.deadline_s:
                    self.slice_set.mark_down(error.slice_indices, "step deadline exceeded", error.generations)
                    raise
                _logger.warning(
                    "step deadline expired while the controller itself was stalled for %.1f of the %.1f s since "
                    "the step was sent (SIGSTOP, a frozen VM, CPU starvation): slices %s are not blamed, the "
                    "step is sent again", stalled, elapsed, error.slice_indices,
                    extra={"event": "controller_stalled", "stalled_s": round(stalled, 3),
                           "slices": error.slice_indices})
        raise AssertionError("not reached")

    def _map_sum_once(self, fn: Any, params: Any, batch: Mapping[str, np.ndarray], active: list[int]) -> Any:
        """One dispatch of `map_sum`'s chunks. A slice that missed its deadline raises
        `SliceDownError(cause="step_deadline")` with `failed_since`, `deadline_s` and `generations` set and
        the slice not marked down (`map_sum` decides)."""
        dispatched_at = time.monotonic()
        sizes = split_sizes(next(iter(batch.values())).shape[0], self.slice_set.count)
        params_np = jax.tree_util.tree_map(np.asarray, params)
        param_leaves = jax.tree_util.tree_leaves(params_np)
        events: queue.Queue = queue.Queue()

        def on_report(index: int, state: str) -> None:
            if index in active and state == "Down":
                events.put(("abort", index, None, None))

        unsubscribe = self.slice_set.add_listener(on_report)
        with self._lock:
            self._events = events
        try:
            if self._interrupted.is_set():
                raise StopRequested("stop requested before the step was sent")
            # `active` is the caller's attempt; a slice that left the active set since (reported Down
            # between two steps: the listener above hears only reports from now on) must end the attempt,
            # not get the step anyway (its worker may still answer: a node the operator gave up on).
            gone = sorted(set(active) - self.slice_set.active)
            if gone:
                raise SliceDownError(f"slices {gone} went down since this attempt began on slices {active}", gone)
            generations: dict[int, int] = {}
            timeouts: dict[int, float] = {}  # by slice: its step's deadline (first steps compile)
            futures: dict[int, concurrent.futures.Future] = {}  # by chunk
            deadline_s = 0.0
            offset = 0
            for chunk, size in enumerate(sizes):
                index = active[chunk % len(active)]
                share = {k: np.asarray(v[offset : offset + size]) for k, v in batch.items()}
                offset += size
                program, out_tree = self._program_and_tree(fn, params_np, share)
                try:
                    client, generation = self._client(index)
                except SliceDownError as e:
                    events.put(("failed", index, chunk, e))
                    continue
                generations[index] = generation
                warm_key = (index, generation, program.hash)
                timeout_s = self.step_deadline_s if warm_key in self._warm else self.first_step_deadline_s
                timeouts[index] = timeout_s
                deadline_s = max(deadline_s, timeout_s)
                # The call may run past the deadline (the loop below decides); its own deadline is the last resort.
                last_resort_s = max(timeout_s * 2 ** DEADLINE_EXTENSIONS,
                                    self.step_deadline_s * 2 ** self.extensions_allowed()) + 5.0
                future = client.step_async(program, param_leaves + jax.tree_util.tree_leaves(share), last_resort_s)
                futures[chunk] = future
                future.add_done_callback(lambda f, i=index, c=chunk, k=warm_key: events.put(("done", i, c, (f, k))))
            results: dict[int, list[np.ndarray]] = {}
            errors: dict[int, BaseException] = {}  # by slice
            pending = {c: active[c % len(active)] for c in range(len(sizes))}
            extensions = 0
            while pending:
                due = min(dispatched_at + timeouts.get(i, deadline_s) * 2 ** extensions for i in pending.values())
                try:
                    kind, index, chunk, payload = events.get(timeout=max(0.0, due - time.monotonic()))
                except queue.Empty:
                    overdue = sorted({i for i in pending.values()
                                      if dispatched_at + timeouts.get(i, deadline_s) * 2 ** extensions <= time.monotonic()})
                    # (warm slices only: a first step's deadline is firstStepDeadlineSeconds'; and not while this
                    # process itself stalled: `map_sum` excuses that one)
                    if (not results and not errors and overdue == active and len(active) >= 2
                            and set(timeouts.values()) == {self.step_deadline_s} and extensions < self.extensions_allowed()
                            and self._stalls.stalled_seconds(dispatched_at) < GAP_S):
                        extensions += 1
                        if extensions == 1:  # (once: a deadline of 0.001 s doubles ~17 times)
                            self._deadline_missed_by_all(active, timeouts[active[0]])
                        continue
                    for c, i in pending.items():
                        if i in overdue:
                            futures[c].cancel()  # (cancels the call: a hung worker does not hold it)
                    error = SliceDownError(f"slices {overdue} missed the step deadline", overdue, cause="step_deadline")
                    error.failed_since, error.generations = dispatched_at, generations
                    error.deadline_s = max(timeouts.get(i, deadline_s) for i in overdue) * 2 ** extensions
                    raise error from None
                if kind == "stop":
                    # The run is stopping: abandon the step (a hung slice may hold it until its deadline).
                    raise StopRequested(f"step abandoned: stop requested while waiting for slices {sorted(set(pending.values()))}")
                if kind == "abort":
                    self.slice_set.mark_down([index], "reported Down by the operator", generations)
                    raise SliceDownError(f"slice {index} reported Down during the step", [index])
                pending.pop(chunk, None)
                if kind == "failed":
                    error = payload
                else:
                    fut, warm_key = payload
                    error = fut.exception()
                    if error is None:
                        results[chunk] = fut.result()
                        self._warm.add(warm_key)
                        continue
                errors.setdefault(index, error)
                if isinstance(error, SliceDownError):
                    if error.cause == "step_deadline":
                        # A hang started when the step was sent, not when the deadline fired; map_sum marks it.
                        error.slice_indices = error.slice_indices or (index,)
                        error.failed_since, error.deadline_s, error.generations = (
                            dispatched_at, timeouts.get(index, deadline_s) * 2 ** extensions, generations)
                        raise error
                    self.slice_set.mark_down(error.slice_indices or [index], str(error), generations)
                    raise error
            if errors:
                self._raise_execution_errors(errors, active, generations)
            if extensions:
                self._report_slow_step(time.monotonic() - dispatched_at, active, timeouts[active[0]] * 2 ** extensions)
        finally:
            unsubscribe()
            with self._lock:
                self._events = None
        return self._reduce([results[c] for c in range(len(sizes))], out_tree)

    def extensions_allowed(self) -> int:
        """Times a step's deadline may be doubled while every active slice misses it with none answering.

        At least `DEADLINE_EXTENSIONS` (4x `stepDeadlineSeconds`), and as many as it takes to reach
        `firstStepDeadlineSeconds`, the longest the job says a step may take (compile included): a
        deadline far below the step time (0.001 s) stays a setting to warn about, never a hang that
        replaces every healthy worker until the restart budget is spent (nvidia-resiliency-ext#129).
        """
        doublings = DEADLINE_EXTENSIONS
        while self.step_deadline_s * 2 ** doublings < self.first_step_deadline_s:
            doublings += 1
        return doublings

    def _deadline_missed_by_all(self, active: list[int], deadline_s: float) -> None:
        """Logs that every active slice missed the step's deadline (`deadline_s`) with none answering: the step
        is slower than the deadline, the slices are not at fault; the step may wait up to
        `extensions_allowed()` doublings longer.

        Marking them down replaced healthy workers until the restart budget was spent (nvidia-resiliency-ext
        #129). One active slice cannot tell a slow step from a hung slice, so it is never excused.
        """
        longest_s = deadline_s * 2 ** self.extensions_allowed()
        _logger.warning(
            "every active slice %s missed the step deadline of %g s with none answering: the step is slower than "
            "%s (%g s), not a slice fault; no slice is marked down, the step may take up to %g s",
            active, deadline_s, DEADLINE_FIELD, self.configured_step_deadline_s, longest_s,
            extra={"event": "step_deadline_extended", "slices": active, "deadline_s": longest_s,
                   "configured_deadline_s": self.configured_step_deadline_s})

    def _report_slow_step(self, seconds: float, active: list[int], deadline_s: float) -> None:
        """Once a step that every slice ran past its deadline answered: the warning naming the field and the
        step time (log and `setting_warnings`), and the run keeps `deadline_s` for its later steps."""
        self.step_deadline_s = max(self.step_deadline_s, deadline_s)
        warning = (f"{DEADLINE_FIELD} ({self.configured_step_deadline_s:g} s) is shorter than a step: every active "
                   f"slice {active} ran past it in the same step, which took {seconds:.1f} s; no slice was marked "
                   f"down, and the run goes on with a deadline of {self.step_deadline_s:g} s; raise "
                   f"{DEADLINE_FIELD} above the step time")
        _logger.warning("%s", warning, extra={"event": "step_deadline_too_short", "step_seconds": round(seconds, 3),
                                              "deadline_s": self.step_deadline_s,
                                              "configured_deadline_s": self.configured_step_deadline_s})
        # One line per field: the newest step time replaces an older one.
        self.setting_warnings = [w for w in self.setting_warnings if not w.startswith(DEADLINE_FIELD)] + [warning]

    def _raise_execution_errors(
        self, errors: Mapping[int, BaseException], active: Sequence[int], generations: Mapping[int, int]
    ) -> None:
        messages = {getattr(e, "message", str(e)) for e in errors.values()}
        if len(errors) == len(active) and len(messages) == 1:
            raise UserCodeError(f"the step program failed on every slice: {messages.pop()}")
        failed = sorted(errors)
        for e in errors.values():
            if not isinstance(e, SliceExecutionError):
                raise e
        self.slice_set.mark_down(failed, "execution error", dict(generations))
        raise SliceDownError(f"slices {failed} failed running the step: {'; '.join(sorted(messages))}", failed)

    @staticmethod
    def _reduce(outputs: Sequence[list[np.ndarray]], out_tree: Any) -> Any:
        """Adds the chunks' output leaves and rebuilds the per-slice function's output tree."""
        total = [np.array(x, copy=True) for x in outputs[0]]
        for out in outputs[1:]:
            for acc, x in zip(total, out):
                acc += x
        return jax.tree_util.tree_unflatten(out_tree, total)

    def interrupt(self) -> None:
        """Makes the in-flight `map_sum` (and every later one) raise `StopRequested` at once.

        Called from a signal handler or the control API when the run stops, so
        a step hung on a stopped worker does not hold the stop (and the final
        checkpoint) until its deadline. Thread-safe.
        """
        self._interrupted.set()
        with self._lock:
            events = self._events
        if events is not None:
            events.put(("stop", None, None, None))

    keeps_state_on_slice_loss = True  # the state never leaves the controller

    def visible_slices(self) -> frozenset[int] | None:
        """None: any Ready slice can take work (its worker answers on its own address)."""
        return None

    def place_state(self, state: Any, active: Sequence[int]) -> Any:
        """The state stays on the controller: returned unchanged."""
        del active
        return state

    def cleanup(self) -> None:
        """After an elastic event: nothing to clear; compiled programs stay cached (the point of elasticity)."""

    def close(self) -> None:
        """Stops warming and closes every worker connection."""
        self._stalls.stop()
        self._warmer.shutdown(wait=False, cancel_futures=True)
        with self._lock:
            for _, _, client in self._clients.values():
                client.close()
            self._clients.clear()
