"""Resume under Orbax's Pathways array handler (issue 29 fault 2), with the real pathwaysutils on CPU devices.

With Pathways persistence on (the controller forces it), `pathwaysutils.initialize()`
registers Orbax's `CloudPathwaysArrayHandler`, which restores only onto
`NamedSharding` targets. The loop's targets were plain `jit` outputs (one
device's `SingleDeviceSharding`): every resume failed ("Pathways only supports
jax.sharding.NamedSharding"), so every controller recreation after the first
checkpoint did. What runs and what is replaced: pathways_restore_child.py.
"""

import json
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).parent
ROOT = HERE.parents[1]


def test_a_committed_step_restores_into_the_meshs_named_sharding_under_the_pathways_handler(tmp_path):
    proc = subprocess.run([sys.executable, str(HERE / "pathways_restore_child.py"), str(tmp_path)],
                          capture_output=True, text=True, timeout=600, cwd=ROOT,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-4000:]
    r = json.loads(lines[-1][len("RESULT "):])
    assert r["first_run"] == {"succeeded": True, "committed": 6}
    assert r["handler"] == "CloudPathwaysArrayHandler"  # registered by pathwaysutils itself
    # The loop's resume: every array restored by the Pathways handler onto the mesh of both slices.
    assert r["resume"] == {"restored_from": 6, "shardings": ["NamedSharding"], "devices": [4], "equal": True}, r
    assert r["asked"] == [json.dumps({"devices": 4, "sharding": "NamedSharding"}, sort_keys=True)]
    # A library program's restore onto plain jit outputs: the same placement, as a NamedSharding.
    assert r["library"] == {"step": 6, "shardings": ["NamedSharding"]}, r
    # pathwaysutils turns JAX's persistent compilation cache off (issue 29 fault 5: not promised any more).
    assert r["compilation_cache_enabled"] is False
