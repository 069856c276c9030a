"""pathways-utils interoperability: its elastic `Manager`, fed by the operator's slice reports.

A program that already uses pathways-utils' `pathwaysutils.elastic.manager.Manager`
(MaxText's `elastic_utils`, or a hand-written loop) finds lost and returned
slices by probing devices: every attempt and every `poll_interval` seconds
(10 by default) its monitor runs a small `pmap` on each slice
(`DefaultSliceHealthChecker`). The operator already knows, and reports each
change to the controller (`PUT /v1/slices/{i}`, into the `SliceSet` that
`elastic_jax.connect()` serves). This module plugs those reports into
pathways-utils through its health-checker interface:

* `SliceReportHealthChecker` is a `pathwaysutils.elastic.elastic.SliceHealthChecker`
  whose answer is the slices the operator reports Ready, optionally confirmed
  by pathways-utils' own device probe run on those slices only (a slice
  reported Down is never probed). pathways-utils' public functions that take
  a checker (`elastic.wait_for_slices(checker=...)`,
  `elastic.get_active_slice_indices(checker=...)`) accept it as is.
* `SliceReportManager` is pathways-utils' `Manager` (its `elastic_retry` loop,
  error classification, retry policy, cleanup, `default_device`,
  `scale_by_active_slices`), with its slice checks going through that
  checker: an attempt starts as soon as enough slices are reported Ready (a
  wait on the slice set, not a poll), and a Ready report of an inactive
  slice wakes the monitor at once, so `available_inactive_slices` holds the
  returning slice at the user's next step boundary.

Why a subclass and not a constructor argument: pathways-utils 0.1.13's
`Manager` takes no checker. Its `__init__` groups `jax.devices()` by
`device.slice_index` and probes every slice; its `elastic_retry` calls
`elastic.wait_for_slices` and its monitor `elastic.get_active_slice_indices`
without a checker, so both always build `DefaultSliceHealthChecker`. The
subclass therefore sets the attributes `__init__` would (from an explicit
`slice_to_devices`, which also lets CPU devices stand in for slices), replaces
the monitor's check (`_check_inactive_slices`, `_monitor_new_slices`), and has
the base `elastic_retry` wait for zero slices (one probe of every slice per
attempt, which returns at once) and then waits on the reports itself before
the user's `pre_callback`. Those three overrides name private methods of
0.1.13 (pinned); a tests/integration/test_pathways_utils.py run against the
real package fails when they change.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence, Set
from typing import Any

import jax
from pathwaysutils.elastic import elastic
from pathwaysutils.elastic import manager as pw_manager

from elastic_jax.controller.elastic.slice_set import SliceSet

_logger = logging.getLogger(__name__)


class SliceReportHealthChecker(elastic.SliceHealthChecker):
    """pathways-utils' `SliceHealthChecker` answered by the operator's slice reports.

    Args:
      slice_set: the slice states the control API feeds (`Runtime.slice_set`).
      slice_to_devices: slice index → its devices (pathways-utils'
        `elastic.get_slice_to_devices(jax.devices())` on Pathways).
      confirm_with_devices: also run pathways-utils' device probe
        (`DefaultSliceHealthChecker`) on the slices reported Ready, and count
        only those that pass (a report can run ahead of the devices).
    """

    def __init__(self, slice_set: SliceSet, slice_to_devices: Mapping[int, Sequence[jax.Device]],
                 confirm_with_devices: bool = True):
        super().__init__(slice_to_devices)
        self.slice_set = slice_set
        self.confirm_with_devices = confirm_with_devices
        self._reported: frozenset[int] = frozenset()
        self._probe: elastic.DefaultSliceHealthChecker | None = None

    def dispatch(self) -> None:
        """Reads the reports; with `confirm_with_devices`, starts the probe on the reported-Ready slices."""
        self._reported = frozenset(self.slice_set.ready() & set(self.slice_to_devices))
        self._probe = None
        if self.confirm_with_devices and self._reported:
            self._probe = elastic.DefaultSliceHealthChecker({i: self.slice_to_devices[i] for i in self._reported})
            self._probe.dispatch()

    def validate(self) -> Set[int]:
        """Returns the slices reported Ready (and passing the probe, when confirming).

        Raises:
          ValueError, jax.errors.JaxRuntimeError: from pathways-utils' probe, for
            a wrong result or an error that is not a lost slice.
        """
        if self._probe is None:
            return self._reported
        return frozenset(self._probe.validate())


class SliceReportManager(pw_manager.Manager):
    """pathways-utils' elastic `Manager`, its slice checks answered by the operator's reports.

    Use it where you would build `Manager()`; `elastic_retry`, `active_slice_indices`,
    `available_inactive_slices`, `default_device` and `ScaleUpSignalError` work as
    pathways-utils documents them:

        rt = elastic_jax.connect()
        manager = SliceReportManager(rt.slice_set)

        @manager.elastic_retry(minimum_slice_count=1, retry_policy=...)
        def train():
            ...
            if manager.available_inactive_slices:  # a Ready report, at once
                raise pw_manager.ScaleUpSignalError()

    Args:
      slice_set: the slice states the control API feeds (`Runtime.slice_set`).
      slice_to_devices: slice index → devices; default pathways-utils'
        `elastic.get_slice_to_devices(jax.devices())` (needs `device.slice_index`,
        i.e. Pathways or TPU devices).
      confirm_with_devices: see `SliceReportHealthChecker`.

    Raises:
      ValueError: a slice index outside 0..`slice_set.total`-1, or no slices.
    """

    def __init__(self, slice_set: SliceSet, slice_to_devices: Mapping[int, Sequence[jax.Device]] | None = None,
                 confirm_with_devices: bool = True):
        # Not Manager.__init__: it would group jax.devices() by slice_index and probe every slice.
        if slice_to_devices is None:
            slice_to_devices = elastic.get_slice_to_devices(jax.devices())
        bad = sorted(i for i in slice_to_devices if not 0 <= i < slice_set.total)
        if bad or not slice_to_devices:
            raise ValueError(f"slice_to_devices: slice indices {bad or '(none)'} are not in 0..{slice_set.total - 1} "
                             f"(spec.slices.count + spares)")
        self.slice_set = slice_set
        self.confirm_with_devices = confirm_with_devices
        self.slice_to_devices = {i: list(d) for i, d in sorted(slice_to_devices.items())}
        self.all_slice_indices = frozenset(self.slice_to_devices)
        self._active_slice_indices = frozenset()
        self.available_inactive_slices = frozenset()
        self.active_slice_indices = self._check(self.all_slice_indices)
        self._stop_event = None
        self._monitor_thread = None
        self._wake = threading.Event()
        self._unsubscribe: Callable[[], None] | None = None
        self.monitor_checks = 0  # monitor checks done (each one a report or a poll_interval)

    def _check(self, indices: Set[int]) -> frozenset[int]:
        """The slices of `indices` the checker finds, run as pathways-utils runs a checker."""
        checker = SliceReportHealthChecker(self.slice_set, {i: self.slice_to_devices[i] for i in indices},
                                           self.confirm_with_devices)
        return frozenset(elastic.get_active_slice_indices(checker.slice_to_devices, checker))

    # -- the monitor: woken by a report, not only by poll_interval ---------------

    def start_monitoring(self, poll_interval: float | int = 10) -> None:
        """Starts pathways-utils' monitor thread; a Ready report of an inactive slice also wakes it at once."""
        if self._unsubscribe is None:
            def on_report(index: int, state: str) -> None:
                if state == "Ready" and index in self.inactive_slice_indices:
                    self._wake.set()

            self._unsubscribe = self.slice_set.add_listener(on_report)
        super().start_monitoring(poll_interval)

    def close(self) -> None:
        """Stops the monitor thread and the report listener (pathways-utils calls it after `elastic_retry`)."""
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None
        self._wake.set()
        super().close()
        self._wake.clear()

    def _monitor_new_slices(self, stop_event: threading.Event, poll_interval: float | int) -> None:
        while not stop_event.is_set():
            self._wake.wait(poll_interval)
            self._wake.clear()
            if stop_event.is_set():
                return
            try:
                self._check_inactive_slices()
            except Exception:  # noqa: BLE001 - as pathways-utils' monitor: log, keep monitoring
                _logger.exception("error in the slice-report monitor")

    def _check_inactive_slices(self) -> None:
        self.monitor_checks += 1
        inactive = self.inactive_slice_indices
        found = self._check(inactive) - self.active_slice_indices if inactive else frozenset()
        if found != self.available_inactive_slices:
            _logger.info("slices %s reported Ready and inactive", sorted(found))
            self.available_inactive_slices = frozenset(found)

    # -- elastic_retry: the wait for slices is a wait on the reports -------------

    def elastic_retry(self, max_retries: int | None = None, minimum_slice_count: int | None = None,
                      poll_interval: float | int = 10, timeout: float | None = None,
                      pre_callback: Callable[..., Any] | None = None,
                      on_elastic_event_callback: Callable[..., Any] | None = None,
                      retry_policy: pw_manager.RetryPolicy | None = None) -> Callable:
        """pathways-utils' `Manager.elastic_retry` (same arguments); each attempt waits for reported slices.

        Before each attempt: wait until `minimum_slice_count` (default: all)
        slices are reported Ready (and pass the probe when confirming), woken by
        each report; `poll_interval` only paces a re-check after a failed probe.

        Raises:
          ValueError: `minimum_slice_count` outside 1..the number of slices
            (pathways-utils would wait forever for more slices than exist).
          (from the wrapped call) TimeoutError: fewer slices than the minimum
            within `timeout` seconds, as pathways-utils' `wait_for_slices`;
            the base's `ElasticRuntimeError` and other errors unchanged.
        """
        target = self.total_slice_count if minimum_slice_count is None else minimum_slice_count
        if not 1 <= target <= self.total_slice_count:
            raise ValueError(f"minimum_slice_count {target}: must be 1..{self.total_slice_count}")

        def before() -> None:
            self.active_slice_indices = self._wait_for_reported(target, poll_interval, timeout)
            self.available_inactive_slices = frozenset()
            if pre_callback is not None:
                pre_callback()

        # minimum 0: the base's own wait (a probe of every slice) returns at once; `before` waits.
        return super().elastic_retry(max_retries=max_retries, minimum_slice_count=0, poll_interval=poll_interval,
                                     timeout=timeout, pre_callback=before,
                                     on_elastic_event_callback=on_elastic_event_callback, retry_policy=retry_policy)

    def _wait_for_reported(self, target: int, poll_interval: float, timeout: float | None) -> frozenset[int]:
        deadline = None if timeout is None else time.monotonic() + timeout
        keys = self.all_slice_indices
        while True:
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not self.slice_set.wait_for(lambda: len(self.slice_set.ready() & keys) >= target, remaining):
                raise TimeoutError(f"timed out waiting for {target} slices reported Ready; reported Ready: "
                                   f"{sorted(self.slice_set.ready() & keys)} after {timeout} s")
            healthy = self._check(keys)
            if len(healthy) >= target:
                _logger.info("elastic attempt on slices %s (reported Ready)", sorted(healthy))
                return frozenset(healthy)
            # Reported Ready but a probe failed: the report ran ahead of the devices; look again shortly.
            if deadline is not None and time.monotonic() + poll_interval >= deadline:
                raise TimeoutError(f"timed out waiting for {target} slices: {sorted(healthy)} pass the device probe")
            time.sleep(poll_interval)

