"""Child process for test_pathways_utils.py: pathways-utils' real `Manager` on slice reports.

4 CPU devices stand in for 2 slices of 2 chips (`device.id // 2`; CPU devices
have no `slice_index`). The operator's reports are applied to a `SliceSet` as
the control API applies them; a lost slice raises what Pathways raises
(`JaxRuntimeError("DATA_LOSS: ...")`). Prints one `RESULT {json}` line.
"""

import os

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
os.environ["JAX_PLATFORMS"] = "cpu"

import json  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402

import jax  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec  # noqa: E402
from pathwaysutils.elastic import elastic  # noqa: E402
from pathwaysutils.elastic import manager as pw_manager  # noqa: E402

from elastic_jax.api.control import SliceReport  # noqa: E402
from elastic_jax.controller.backend_pathways import slice_to_devices  # noqa: E402
from elastic_jax.controller.elastic.pathways_utils import SliceReportHealthChecker, SliceReportManager  # noqa: E402
from elastic_jax.controller.elastic.slice_set import SliceSet  # noqa: E402

# Longer than the test could ever run: a check the monitor does came from a report, not a poll.
NEVER_S = 3600


def slice_of(device):
    return device.id // 2


def report(slice_set, index, state, generation):
    """As the control API thread applies `PUT /v1/slices/{index}`."""
    addresses = [f"127.0.0.1:{8470 + index}"] if state == "Ready" else []
    t = threading.Thread(target=slice_set.apply_report,
                         args=(index, SliceReport(state=state, generation=generation, addresses=addresses)))
    t.start()
    t.join()


def fresh():
    slice_set = SliceSet(2)
    for i in range(2):
        report(slice_set, i, "Ready", 1)
    return slice_set, slice_to_devices(jax.devices(), slice_of)


def step_on(manager):
    """A data-parallel sum over the active slices' devices; returns (sum, devices used)."""
    devices = [d for i in sorted(manager.active_slice_indices) for d in manager.slice_to_devices[i]]
    x = jax.device_put(np.arange(8, dtype=np.float32), NamedSharding(Mesh(np.array(devices), ("d",)), PartitionSpec("d")))
    return float(jax.jit(lambda v: v.sum())(x)), len(x.sharding.device_set)


def replica_resize(out):
    """minimum 1: slice 1 lost at step 10, training goes on on slice 0, slice 1 reported back, scale-up."""
    slice_set, devices = fresh()
    manager = SliceReportManager(slice_set, devices)
    out["initial_active"] = sorted(manager.active_slice_indices)
    attempts, events, n = [], [], {"steps": 0, "back": False}

    @manager.elastic_retry(minimum_slice_count=1, poll_interval=NEVER_S, timeout=120,
                           retry_policy=pw_manager.ElasticRetryLimit(5),
                           on_elastic_event_callback=lambda: events.append(sorted(manager.active_slice_indices)))
    def train():
        attempts.append({"active": sorted(manager.active_slice_indices), "at_step": n["steps"],
                         "default_device_slice": slice_of(manager.default_device)})
        while n["steps"] < 30:
            if n["steps"] == 10 and len(attempts) == 1:
                report(slice_set, 1, "Down", 2)  # the operator saw the pod die
                raise jax.errors.JaxRuntimeError("DATA_LOSS: slice 1 heartbeat lost")
            if n["steps"] == 15 and not n["back"]:
                n["back"] = True
                checks_before = manager.monitor_checks
                report(slice_set, 1, "Ready", 3)  # the replacement is up
                bound = time.monotonic() + 60  # a bound for a broken adapter, not a timing claim
                while not manager.available_inactive_slices and time.monotonic() < bound:
                    time.sleep(0.01)
                out["seen_after_report"] = sorted(manager.available_inactive_slices)
                out["monitor_checks_for_report"] = manager.monitor_checks - checks_before
            if manager.available_inactive_slices:
                raise pw_manager.ScaleUpSignalError()
            total, used = step_on(manager)
            assert total == 28.0, total
            attempts[-1]["devices"] = used
            n["steps"] += 1
        return n["steps"]

    out["resize_steps"] = train()
    out["resize_attempts"] = attempts
    out["resize_events"] = events
    out["monitor_stopped"] = manager._monitor_thread is None


def pause_resume(out):
    """minimum = all: after the loss, the next attempt starts only once slice 1 is reported Ready again."""
    slice_set, devices = fresh()
    manager = SliceReportManager(slice_set, devices)
    attempts = []

    def back_later():
        # The report arrives while the next attempt waits (a real operator: when the new pod is Ready).
        threading.Timer(0.5, report, args=(slice_set, 1, "Ready", 5)).start()

    @manager.elastic_retry(poll_interval=NEVER_S, timeout=120, retry_policy=pw_manager.ElasticRetryLimit(3),
                           on_elastic_event_callback=back_later)
    def train():
        attempts.append({"active": sorted(manager.active_slice_indices),
                         "slice1_generation": slice_set.record(1).generation})
        if len(attempts) == 1:
            report(slice_set, 1, "Down", 2)
            raise jax.errors.JaxRuntimeError("DATA_LOSS: slice 1 lost")
        return step_on(manager)

    out["pause_result"] = list(train())
    out["pause_attempts"] = attempts


def errors(out):
    slice_set, devices = fresh()
    report(slice_set, 1, "Down", 2)
    manager = SliceReportManager(slice_set, devices)
    out["down_at_start_active"] = sorted(manager.active_slice_indices)
    try:
        manager.elastic_retry(minimum_slice_count=3)
    except ValueError as e:
        out["bad_minimum"] = str(e)

    @manager.elastic_retry(poll_interval=NEVER_S, timeout=0.5)
    def never():
        return "ran"

    try:
        never()
    except TimeoutError as e:
        out["timeout"] = str(e)
    try:
        SliceReportManager(SliceSet(1), devices)
    except ValueError as e:
        out["bad_devices"] = str(e)
    # pathways-utils' public wait with our checker, beside its default probe (CPU devices never fail it).
    checker = SliceReportHealthChecker(slice_set, devices)
    out["wait_with_checker"] = sorted(elastic.wait_for_slices(slice_count=1, slice_to_devices=devices,
                                                              poll_interval=0.01, checker=checker))
    out["default_probe"] = sorted(elastic.get_active_slice_indices(devices))
    try:
        pw_manager.Manager(jax.devices())
    except AttributeError as e:
        out["pathways_utils_own_manager_on_cpu"] = repr(e)


def main():
    out = {}
    for part in (replica_resize, pause_resume, errors):
        part(out)
    print("RESULT " + json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
