"""Issue 31 FAIL 1 (b): the operator process reads an object nested as deep as the API server stores
(10000 levels) through what kopf does with a watch event (decode, Body, diff-base, compare, copy), in a
process whose stack limit starts small (1 MiB), in the main thread and in a pool thread."""

from __future__ import annotations

import resource
import subprocess
import sys
import textwrap

import pytest

PROGRAM = textwrap.dedent("""
    import concurrent.futures, copy, json, sys
    import kopf
    from elastic_jax.k8s_operator import deep_objects
    from elastic_jax.k8s_operator.main import HandledMarkerDiffBase
    if sys.argv[1] == "prepared":
        deep_objects.prepare()
    levels = 10_000 - 5  # the API server's bound, less the event, object, spec, controller, trainer levels
    body = json.dumps({"apiVersion": "elasticjax.dev/v1alpha1", "kind": "ElasticTrainingJob",
                       "metadata": {"name": "d", "namespace": "a"},
                       "spec": {"controller": {"trainer": {"config": "HOLE"}}}})
    line = json.dumps({"type": "ADDED", "object": "OBJ"}).replace('"OBJ"', body.replace('"HOLE"', "[" * levels + "]" * levels))

    def watch_event():
        event = json.loads(line)  # kopf's watch decoder
        body = kopf.Body(event["object"])
        store = HandledMarkerDiffBase(prefix="elasticjax.dev", key="last-handled-configuration")
        assert store.build(body=body) == store.build(body=body)
        copy.deepcopy(event)
        return "ok"

    print(watch_event())
    with concurrent.futures.ThreadPoolExecutor(1) as pool:  # kopf's handler threads
        print(pool.submit(watch_event).result())
""")


def _small_stack():
    resource.setrlimit(resource.RLIMIT_STACK, (1 << 20, resource.getrlimit(resource.RLIMIT_STACK)[1]))


@pytest.mark.parametrize("mode,readable", [("prepared", True), ("default", False)])
def test_an_object_as_deep_as_the_api_server_stores_is_readable_once_prepared(mode, readable):
    result = subprocess.run([sys.executable, "-c", PROGRAM, mode], capture_output=True, text=True, timeout=300,
                            preexec_fn=_small_stack)
    if readable:
        assert result.returncode == 0 and result.stdout.split() == ["ok", "ok"], result.stderr[-3000:]
    else:  # without it: RecursionError (or a crash on the small stack), never "ok"
        assert result.returncode != 0 and "ok" not in result.stdout, result.stdout


def test_prepare_never_lowers_settings():
    from elastic_jax.k8s_operator import deep_objects

    code = ("import sys; from elastic_jax.k8s_operator import deep_objects; sys.setrecursionlimit(90000); "
            "deep_objects.prepare(); print(sys.getrecursionlimit())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert int(out.stdout) == 90000 > deep_objects.RECURSION_LIMIT
