"""The elastic manager: keeps a training function running while slices come and go.

Semantics follow pathways-utils' `pathwaysutils.elastic.manager.Manager`
(`elastic_retry`): before each attempt wait until at least
`minimum_slice_count` slices are up (equal to the desired count: pause and
resume; lower: replica resize), run the function on them, and on a slice-down
error or a scale-up signal clean up, tell the callback, ask the retry policy,
and try again. Differences, because our slices are told to us rather than
probed from `jax.devices()`:

* the slice set is fed by the operator's control-API reports (`SliceSet`),
  and a health check (a ping on the cpu backend) confirms a slice before it
  joins;
* the scale-up signal is raised by the training loop at a step boundary when
  `SliceSet.available_inactive()` is not empty;
* a failure of the *same* user-code error on every slice is not a slice-down
  error and is never retried (see `backend_cpu` for the classification).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from elastic_jax.controller.elastic.errors import (ElasticRuntimeError, ScaleUpSignalError, SliceDownError, StopRequested,
                                                   is_slice_down, slice_down_verdict)
from elastic_jax.controller.elastic.slice_set import SliceSet

_logger = logging.getLogger(__name__)

RetryPolicy = Callable[[int, Exception], bool]
HealthCheck = Callable[[Iterable[int]], frozenset[int]]
_F = TypeVar("_F", bound=Callable[..., Any])


# Before the first attempt, wait at most this long for every slice (not only the minimum).
STARTUP_GRACE_MAX_S = 30.0


def job_retry_settings(spec: Any) -> dict[str, Any]:
    """`Manager.elastic_retry` keyword arguments a job's spec sets (the built-in loop's and the library's).

    Args:
      spec: an `ElasticTrainingJobSpec`.

    Returns:
      minimum_slice_count (`spec.slices.minSlices` or `count`), timeout_s
      (`spec.elasticity.sliceWaitTimeoutSeconds`), startup_grace_s (that
      timeout, at most `STARTUP_GRACE_MAX_S` seconds: a job does not start on
      the minimum and resize at once).
    """
    wait_s = spec.elasticity.slice_wait_timeout_seconds
    return {"minimum_slice_count": spec.slices.minimum, "timeout_s": wait_s,
            "startup_grace_s": min(STARTUP_GRACE_MAX_S, wait_s)}


class Manager:
    """Elastic retry around a training function, over a `SliceSet`.

    Args:
      slice_set: the slices, fed by the control API.
      health_check: `indices -> healthy subset`; called on candidate slices
        before an attempt. Unhealthy ones are marked down.
      poll_interval_s: seconds between re-checks while waiting for slices.
      stop_event: when set, a wait for slices ends with `StopRequested` (SIGTERM
        during a pause must not wait out the pod's grace period).
      visible: `() -> slices the backend can place work on now` (pathways: those
        with devices in `jax.devices()`; a None result: every slice); None: every slice. A Ready slice that
        is not visible yet (its node pool came up after the controller started;
        its workers are still registering) waits: neither health-checked nor
        marked down, nor a scale-up signal.
      on_wait: called as `on_wait(True, up)` when a wait for slices has to block
        (`up`: the healthy slices at the first look, fewer than needed) and as
        `on_wait(False, fewest)` when that wait ends (`fewest`: the fewest healthy
        slices it saw while blocked; the goodput ledger's "waiting", the
        recovery record's pause).
      on_slices_lost: called with the slices of the last attempt found down
        during the wait before the next one, each once per wait: those the
        error that ended the attempt named and any other (a second slice lost
        while the first one's loss is recovered, which no step failed on).
      prepare: `slices -> the subset ready to join now` (the backend's
        `prepare`: on cpu, the step programs are compiled there), starting to
        ready the rest; None: every slice is ready. Spares and rejoining
        slices are prepared while the mesh trains: a scale-up waits until the
        slice is prepared (the active slices never wait for its compile), and
        a swap prefers prepared spares.
      default_device: `active slices -> device`: each attempt runs under `jax.default_device` of it (pathways:
        a device of an active slice, as pathways-utils' manager does; `jax.devices()[0]` may be on a lost
        slice); None: JAX's default.

    Attributes:
      attempts: attempts started by the last `elastic_retry` call.
      waiting: True while blocked waiting for slices (shown as a paused phase).
    """

    def __init__(self, slice_set: SliceSet, health_check: HealthCheck | None = None, poll_interval_s: float = 1.0,
                 stop_event: threading.Event | None = None,
                 visible: Callable[[], frozenset[int]] | None = None,
                 on_wait: Callable[[bool, int], Any] | None = None,
                 on_slices_lost: Callable[[frozenset[int]], Any] | None = None,
                 prepare: Callable[[frozenset[int]], frozenset[int]] | None = None,
                 default_device: Callable[[frozenset[int]], Any] | None = None):
        self.slice_set = slice_set
        self.default_device = default_device
        self.prepare = prepare
        self.on_wait = on_wait
        self.on_slices_lost = on_slices_lost
        # The last attempt's slices not yet seen down, while the wait before the next attempt runs.
        self._watched: frozenset[int] = frozenset()
        self.visible = visible
        self.stop_event = stop_event or threading.Event()
        self.health_check = health_check or (lambda indices: frozenset(indices))
        self.poll_interval_s = poll_interval_s
        self.attempts = 0
        self.waiting = False

    @property
    def total_slice_count(self) -> int:
        """Desired number of active slices (spares not counted)."""
        return self.slice_set.count

    @property
    def active_slice_indices(self) -> frozenset[int]:
        """Slices in the training mesh."""
        return self.slice_set.active

    def available_inactive_slices(self) -> frozenset[int]:
        """Slices up, prepared and not yet training; non-empty means: raise `ScaleUpSignalError` at the next step
        boundary.

        Called at every step boundary, it also keeps preparing the slices that
        wait outside the mesh (the hot spares; rejoining slices not prepared yet).
        """
        joining = self.slice_set.available_inactive()
        visible = self.visible() if joining and self.visible is not None else None
        joining = joining if visible is None else joining & visible
        if self.prepare is None:
            return joining
        return joining & self._prepared(joining | self.slice_set.spare_indices())

    def _prepared(self, idle: frozenset[int]) -> frozenset[int]:
        """The slices of `idle` (Ready, outside the mesh) that are prepared; the others read `Warming` in
        status (`SliceSet.set_warming`) until a later call finds them prepared."""
        prepared = self.prepare(idle) if self.prepare is not None and idle else idle
        self.slice_set.set_warming(idle - prepared)
        return prepared

    def _candidates(self) -> frozenset[int]:
        """Ready slices the backend can place work on."""
        ready = self.slice_set.ready()
        visible = self.visible() if ready and self.visible is not None else None
        return ready if visible is None else ready & visible

    def wait_for_slices(self, slice_count: int, timeout_s: float | None) -> frozenset[int]:
        """Waits until at least `slice_count` Ready slices pass the health check.

        Args:
          slice_count: how many slices are needed.
          timeout_s: seconds; None waits forever.

        Returns:
          Every Ready and healthy slice (possibly more than `slice_count`).

        Raises:
          TimeoutError: fewer than `slice_count` healthy slices after `timeout_s`.
          StopRequested: `stop_event` was set while waiting.
        """
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        self.waiting = True
        blocked = False
        fewest = 0  # healthy slices, the fewest seen while blocked
        try:
            while True:
                if self.stop_event.is_set():
                    raise StopRequested("stop requested while waiting for slices")
                ready = self._candidates()
                healthy = self.health_check(ready) if ready else frozenset()
                unhealthy = ready - healthy
                if unhealthy:
                    gens = {i: self.slice_set.record(i).generation for i in unhealthy}
                    self.slice_set.mark_down(unhealthy, "failed health check", gens)
                self._report_lost()
                fewest = min(fewest, len(healthy)) if blocked else len(healthy)
                if len(healthy) >= slice_count:
                    return healthy
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    raise TimeoutError(
                        f"only {len(healthy)} of the {slice_count} slices needed were ready after {timeout_s:.0f} s"
                    )
                if not blocked and self.on_wait is not None:
                    blocked = True
                    self.on_wait(True, fewest)
                # Wake on any report, or re-check after the poll interval.
                wait_s = self.poll_interval_s if remaining is None else min(self.poll_interval_s, remaining)
                seen = self.slice_set.ready()
                self.slice_set.wait_for(lambda: self.slice_set.ready() != seen or self.stop_event.is_set(), wait_s)
        finally:
            self.waiting = False
            self._watched = frozenset()
            if blocked and self.on_wait is not None:
                self.on_wait(False, fewest)

    def _report_lost(self) -> None:
        """Tells `on_slices_lost` of the last attempt's slices that are down now (not Ready: the operator
        reported them, or the health check just marked them), once each: a slice lost while another one's
        loss is recovered is that recovery's too, though no step failed on it."""
        gone = self._watched - self.slice_set.ready()
        if gone:
            self._watched -= gone
            if self.on_slices_lost is not None:
                self.on_slices_lost(gone)

    def elastic_retry(
        self,
        minimum_slice_count: int | None = None,
        timeout_s: float | None = None,
        retry_policy: RetryPolicy | None = None,
        pre_callback: Callable[[], Any] | None = None,
        on_elastic_event_callback: Callable[[Exception], Any] | None = None,
        cleanup: Callable[[], Any] | None = None,
        startup_grace_s: float = 0.0,
    ) -> Callable[[_F], _F]:
        """Decorator: run the function on the active slices, retrying through elastic events.

        Args:
          minimum_slice_count: fewest slices to run on; None means all
            (pause and resume).
          timeout_s: seconds to wait for enough slices before each attempt.
          retry_policy: `(attempt, error) -> bool`; default retries forever.
          pre_callback: called before each attempt, after the active set is set.
          on_elastic_event_callback: called with the error after each slice-down
            error or scale-up signal, before the retry policy.
          cleanup: backend cleanup after an event (pathways and cpu: nothing, compiled
            programs and the state's arrays are kept; pathways-utils clears JAX's caches and live arrays).
          startup_grace_s: the first attempt first waits this long for *all*
            slices, so a job does not start on the minimum and resize at once.

        Returns:
          The decorator.

        Raises (from the wrapped call):
          ElasticRuntimeError: the retry policy refused, or slices did not come
            back within `timeout_s`.
          Exception: any error that is not a slice-down error, unchanged.
        """
        target = self.total_slice_count if minimum_slice_count is None else minimum_slice_count
        if not 1 <= target <= self.total_slice_count:
            raise ValueError(f"minimum_slice_count must be in 1..{self.total_slice_count}, got {target}")
        policy = retry_policy or (lambda attempt, error: True)

        def decorator(func: _F) -> _F:
            @functools.wraps(func)
            def wrapper(*args: Any, **kwargs: Any) -> Any:
                attempt = 0
                attempt_slices: frozenset[int] = frozenset()
                while True:
                    attempt += 1
                    self.attempts = attempt
                    self._watched = attempt_slices  # (the last attempt's: a loss found while waiting is reported)
                    healthy = self._wait(target, timeout_s, startup_grace_s if attempt == 1 else 0.0)
                    # Hot spares: at most `count` train; a spare replaces a lost slice here, at once
                    # (a prepared one first: it runs the retried step without compiling).
                    prepared = self._prepared(healthy - self.slice_set.active)
                    self.slice_set.set_active(self.slice_set.choose_active(healthy, prefer=prepared))
                    attempt_slices = self.slice_set.active
                    _logger.info("elastic attempt %d on slices %s", attempt, sorted(attempt_slices))
                    if pre_callback is not None:
                        pre_callback()
                    try:
                        with self._on_active_slice():
                            return func(*args, **kwargs)
                    except ScaleUpSignalError as error:
                        self._handle_event(attempt, error, policy, cleanup, on_elastic_event_callback)
                    except Exception as error:  # noqa: BLE001 - re-raised unless it is a slice loss
                        if not is_slice_down(error):
                            lost = self.confirms_slice_loss(error, attempt_slices)
                            if not lost:
                                raise
                            first = " ".join(str(error).split())[:300]
                            error = SliceDownError(f"slices {sorted(lost)} down after {first}", lost)
                        _logger.warning("elastic event: %s", error)
                        self._handle_event(attempt, error, policy, cleanup, on_elastic_event_callback)

            return wrapper  # type: ignore[return-value]

        return decorator

    def confirms_slice_loss(self, error: BaseException, slices: frozenset[int]) -> frozenset[int]:
        """The `slices` (the attempt's) down right after a "suspect" error (INTERNAL, NOT_FOUND:
        `errors.slice_down_verdict`).

        pathways-utils counts those statuses as slice losses; XLA also raises them for errors no slice
        caused (a host callback that raised). So such an error is a slice loss only when an active slice
        is down now: no longer Ready (the operator reported it), or failing the health check (then marked
        down, as a failed health check before an attempt is).

        Returns:
          The slices of `slices` that are down (empty: not a slice loss; also for any error that is not suspect).
        """
        if slice_down_verdict(error) != "suspect":
            return frozenset()
        active = frozenset(slices)
        ready = active & self.slice_set.ready()
        healthy = self.health_check(ready) if ready else frozenset()
        failed = ready - healthy
        if failed:
            gens = {i: self.slice_set.record(i).generation for i in failed}
            self.slice_set.mark_down(failed, "failed health check", gens)
        return active - healthy

    def _on_active_slice(self) -> contextlib.AbstractContextManager:
        """`jax.default_device` of the `default_device` hook's choice for this attempt's slices (or nothing)."""
        if self.default_device is None:
            return contextlib.nullcontext()
        import jax

        return jax.default_device(self.default_device(self.slice_set.active))

    def _wait(self, target: int, timeout_s: float | None, grace_s: float) -> frozenset[int]:
        if grace_s > 0 and target < self.total_slice_count:
            try:
                return self.wait_for_slices(self.total_slice_count, grace_s)
            except TimeoutError:
                _logger.info("not all slices up after %.0f s; starting on the minimum %d", grace_s, target)
        try:
            return self.wait_for_slices(target, timeout_s)
        except TimeoutError as e:
            raise ElasticRuntimeError(f"{e} (spec.elasticity.sliceWaitTimeoutSeconds)") from None

    def _handle_event(
        self,
        attempt: int,
        error: Exception,
        policy: RetryPolicy,
        cleanup: Callable[[], Any] | None,
        callback: Callable[[Exception], Any] | None,
    ) -> None:
        if cleanup is not None:
            cleanup()
        if callback is not None:
            callback(error)
        if not policy(attempt, error):
            reason = getattr(policy, "reason", None) or f"retry policy refused attempt {attempt + 1}"
            raise ElasticRuntimeError(reason) from error
