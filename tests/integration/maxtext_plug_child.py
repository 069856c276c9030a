"""Child process for test_pathways_utils.py: MaxText's call pattern on the manager `maxtext_plug` puts in its global.

A stand-in `maxtext.utils.elastic_utils` (the global and the calls MaxText 0.2.5's elastic_utils makes on it:
`total_slice_count`, `elastic_retry(max_retries=, timeout=, minimum_slice_count=, pre_callback=,
on_elastic_event_callback=)`, `active_slice_indices`, `available_inactive_slices`) over the real
pathways-utils; 4 CPU devices stand in for 2 slices (`device.id // 2`). Prints one `RESULT {json}` line.
"""

import os

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
os.environ["JAX_PLATFORMS"] = "cpu"

import json  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import types  # noqa: E402

import jax  # noqa: E402

from elastic_jax import maxtext_plug  # noqa: E402
from elastic_jax.controller.backend_pathways import slice_to_devices  # noqa: E402
from elastic_jax.controller.elastic.pathways_utils import SliceReportManager  # noqa: E402
from elastic_jax.controller.elastic.slice_set import SliceSet  # noqa: E402
from tests.integration.pathways_utils_child import report  # noqa: E402  (the control API's way to apply one)


def standin_maxtext():
    for name in ("maxtext", "maxtext.utils"):
        module = types.ModuleType(name)
        module.__path__ = []
        sys.modules[name] = module
    elastic_utils = types.ModuleType(maxtext_plug.ELASTIC_UTILS)
    elastic_utils.elastic_manager = None
    sys.modules[maxtext_plug.ELASTIC_UTILS] = elastic_utils
    elastic_utils.__spec__ = types.SimpleNamespace(name=maxtext_plug.ELASTIC_UTILS)
    return elastic_utils


def main():
    out = {}
    elastic_utils = standin_maxtext()
    slice_set = SliceSet(2)
    for i in range(2):
        report(slice_set, i, "Ready", 1)
    devices = slice_to_devices(jax.devices(), lambda d: d.id // 2)
    lazy = maxtext_plug.plug("maxtext.trainers.pre_train.train", "pathways", slice_set,
                             build=lambda ss: SliceReportManager(ss, devices))
    out["plugged"] = elastic_utils.elastic_manager is lazy and not lazy.built
    em = elastic_utils.elastic_manager
    out["total_slice_count"] = em.total_slice_count  # MaxText's check of elastic_min_slice_count
    out["built_by"] = type(lazy.manager()).__name__
    attempts, events, state = [], [], {"lost": False, "scale_up_seen": None}

    @em.elastic_retry(max_retries=5, timeout=60, minimum_slice_count=1, pre_callback=lambda: None,
                      on_elastic_event_callback=lambda: events.append(sorted(em.active_slice_indices)))
    def train():
        attempts.append(sorted(em.active_slice_indices))
        if not state["lost"]:
            state["lost"] = True
            report(slice_set, 1, "Down", 2)  # the operator saw slice 1's pod die
            raise jax.errors.JaxRuntimeError("DATA_LOSS: slice 1 heartbeat lost")
        report(slice_set, 1, "Ready", 3)  # its replacement is up: MaxText's is_scale_up_event reads this
        deadline = time.monotonic() + 30
        while not em.available_inactive_slices and time.monotonic() < deadline:
            time.sleep(0.05)
        state["scale_up_seen"] = sorted(em.available_inactive_slices)
        return "done"

    out["result"] = train()
    out.update(attempts=attempts, events=events, scale_up_seen=state["scale_up_seen"])
    print("RESULT " + json.dumps(out))


if __name__ == "__main__":
    main()
