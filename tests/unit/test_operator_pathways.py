"""The pathways renderer: golden files of every child for three slice shapes, the TPU table, the errors.

Golden files are in tests/unit/golden/pathways/<case>.yaml: the
backend-dependent children of one job (Service, controller Pod, one JobSet
per slice) as a YAML stream. After an intended change to the rendering, regenerate them and
review the diff:

    UPDATE_GOLDEN=1 .venv/bin/python -m pytest -q tests/unit/test_operator_pathways.py
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from elastic_jax.api import labels
from elastic_jax.api.manifest import parse_manifest
from elastic_jax.k8s_operator import backends, children
from elastic_jax.k8s_operator.backends import UnsupportedBackend, renderer_for
from elastic_jax.k8s_operator.backends.pathways import PathwaysRenderer, proxy_image, server_image
from elastic_jax.k8s_operator.backends.tpu_shapes import GENERATIONS, SliceShapeError, slice_shape

GOLDEN = Path(__file__).parent / "golden" / "pathways"
TOKEN = "golden-token"
JOB_UID = "0b5e4c1a-golden-job-uid"


def pathways_job(accelerator="tpu-v5-lite-podslice", topology="2x2", count=2, name="tpu-job", **spec):
    """A parsed pathways job (namespace `ml`), `spec` merged over a small base."""
    base = {
        "backend": "pathways",
        "slices": {"count": count, "minSlices": 1, "accelerator": accelerator, "topology": topology},
        "controller": {"image": "ghcr.io/example/trainer:1.0",
                       "trainer": {"entryPoint": "elastic_jax.controller.builtin_lm:make_trainer"},
                       "env": [{"name": "USER_VAR", "value": "1"}], "resources": {"requests": {"cpu": "4"}}},
        "training": {"steps": 1000, "globalBatchSize": 64},
        "checkpoint": {"uri": "gs://my-bucket/tpu-job"},
    }
    for key, value in spec.items():
        base[key] = {**base[key], **value} if isinstance(base.get(key), dict) else value
    return parse_manifest({"apiVersion": "elasticjax.dev/v1alpha1", "kind": "ElasticTrainingJob",
                           "metadata": {"name": name, "namespace": "ml", "uid": JOB_UID}, "spec": base})


# (golden file, job): the issue's v5e 2x2 x 2 slices, a multi-host v5p, a multi-host v6e.
CASES = {
    "v5e-2x2-x2": lambda: pathways_job("tpu-v5-lite-podslice", "2x2", count=2),
    "v5p-2x2x2-x2": lambda: pathways_job("tpu-v5p-slice", "2x2x2", count=2),
    "v6e-4x4-x3": lambda: pathways_job("tpu-v6e-slice", "4x4", count=3,
                                       worker={"image": "us-docker.pkg.dev/cloud-tpu-v2-images/pathways/server:2025-06-01",
                                               "env": [{"name": "W", "value": "x"}]}),
}


def render(job) -> str:
    """The Service, controller Pod and slice JobSets, as the YAML stream the golden files hold.

    Secret and ConfigMap are left out: they do not depend on the backend (the
    ConfigMap holds every spec default, which would tie these files to
    unrelated API changes) and tests/unit/test_operator_render.py covers them.
    """
    objs = children.render_children(backends.resolve(job), token=TOKEN, job_uid=JOB_UID)
    return yaml.safe_dump_all([o for o in objs if o["kind"] not in ("Secret", "ConfigMap")], sort_keys=False)


@pytest.mark.parametrize("case", sorted(CASES))
def test_rendered_children_match_golden_file(case):
    text = render(CASES[case]())
    path = GOLDEN / f"{case}.yaml"
    if os.environ.get("UPDATE_GOLDEN"):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert path.exists(), f"{path} missing: run with UPDATE_GOLDEN=1 and review it"
    assert text == path.read_text(), f"{path} differs: review, then regenerate with UPDATE_GOLDEN=1"


# -- the table --------------------------------------------------------------------------------


@pytest.mark.parametrize("accelerator, topology, hosts, instance_type", [
    ("tpu-v5-lite-podslice", "2x2", 1, "tpuv5e:2x2"),
    ("tpu-v5-lite-podslice", "2x4", 2, "tpuv5e:2x4"),
    ("tpu-v5-lite-podslice", "16x16", 64, "tpuv5e:16x16"),
    ("tpu-v5p-slice", "2x2x1", 1, "tpuv5:2x2x1"),
    ("tpu-v5p-slice", "2x2x2", 2, "tpuv5:2x2x2"),
    ("tpu-v5p-slice", "4x4x4", 16, "tpuv5:4x4x4"),
    ("tpu-v6e-slice", "4x4", 4, "tpuv6e:4x4"),
    ("tpu7x", "2x2x1", 1, "tpu7x:2x2x1"),
    ("tpu7x", "2x2x2", 2, "tpu7x:2x2x2"),
    ("tpu-v4-podslice", "2x2x4", 4, "tpuv4:2x2x4"),
])
def test_topology_gives_hosts_and_four_chips_per_host(accelerator, topology, hosts, instance_type):
    shape = slice_shape(accelerator, topology)
    assert (shape.hosts, shape.chips_per_host, shape.chips) == (hosts, 4, hosts * 4)
    assert shape.instance_type == instance_type


def test_table_has_the_generations_the_issue_names():
    assert {"tpu-v5-lite-podslice", "tpu-v5p-slice", "tpu-v6e-slice", "tpu7x"} <= set(GENERATIONS)


@pytest.mark.parametrize("accelerator, topology, message", [
    ("tpu-v9-imaginary", "2x2", "spec.slices.accelerator 'tpu-v9-imaginary' is not a TPU accelerator this operator knows (known: "),
    ("nvidia-h100", "2x2", "spec.slices.accelerator 'nvidia-h100'"),
    ("tpu-v5-lite-podslice", "2by2", "spec.slices.topology '2by2' must look like AxB or AxBxC"),
    ("tpu-v5-lite-podslice", "0x2", "spec.slices.topology '0x2' must look like AxB"),
    ("tpu-v5-lite-podslice", "2x2x2", "spec.slices.topology '2x2x2' must have 2 dimensions for tpu-v5-lite-podslice (e.g. 2x2)"),
    ("tpu-v5p-slice", "2x2", "spec.slices.topology '2x2' must have 3 dimensions for tpu-v5p-slice (e.g. 2x2x2)"),
    ("tpu-v5-lite-podslice", "1x1", "spec.slices.topology '1x1' has 1 chips, not a multiple of the 4 chips per host"),
])
def test_unknown_shapes_name_the_field(accelerator, topology, message):
    with pytest.raises(SliceShapeError) as e:
        slice_shape(accelerator, topology)
    assert message in str(e.value)
    assert isinstance(e.value, UnsupportedBackend)  # the handlers' Failed-with-condition path


# -- resolve: fields derived from the topology -------------------------------------------------


def test_hosts_and_chips_are_derived_when_left_at_the_default():
    job = backends.resolve(pathways_job("tpu-v6e-slice", "4x4"))
    assert (job.spec.slices.hosts_per_slice, job.spec.slices.devices_per_host) == (4, 4)


def test_matching_hosts_per_slice_is_accepted():
    job = pathways_job("tpu-v5p-slice", "2x2x2", slices={"hostsPerSlice": 2, "devicesPerHost": 4})
    assert backends.resolve(job).spec.slices.hosts_per_slice == 2


@pytest.mark.parametrize("slices, message", [
    ({"hostsPerSlice": 3}, "spec.slices.hostsPerSlice is 3 but tpu-v5p-slice 2x2x2 has 2 hosts; omit it or set 2"),
    ({"devicesPerHost": 8}, "spec.slices.devicesPerHost is 8 but tpu-v5p-slice 2x2x2 has 4 chips per host"),
])
def test_conflicting_slice_fields_are_refused_naming_the_field(slices, message):
    with pytest.raises(UnsupportedBackend, match=message):
        backends.resolve(pathways_job("tpu-v5p-slice", "2x2x2", slices=slices))


def test_local_checkpoint_uri_is_refused_naming_the_field():
    with pytest.raises(UnsupportedBackend, match=r"spec.checkpoint.uri must be gs://bucket/prefix for backend pathways"):
        backends.resolve(pathways_job(checkpoint={"uri": "/tmp/ck"}))


def test_cpu_jobs_are_unchanged_by_resolve():
    job = parse_manifest({"apiVersion": "elasticjax.dev/v1alpha1", "kind": "ElasticTrainingJob",
                          "metadata": {"name": "c"}, "spec": {"slices": {"count": 2},
                          "training": {"steps": 1, "globalBatchSize": 2}, "checkpoint": {"uri": "/tmp/c"}}})
    assert backends.resolve(job) is job


# -- properties the golden files encode, stated once so a regenerated file cannot drop them --


def test_renderer_for_pathways():
    assert isinstance(renderer_for("pathways"), PathwaysRenderer)


def test_workers_land_on_their_tpu_pool_with_chip_limits():
    js = PathwaysRenderer().worker_jobset(pathways_job("tpu-v5p-slice", "2x2x2", count=3), 2)
    assert js["metadata"]["annotations"] == {labels.JOBSET_EXCLUSIVE_TOPOLOGY: "cloud.google.com/gke-nodepool"}
    job = js["spec"]["replicatedJobs"][0]["template"]["spec"]
    assert job["parallelism"] == job["completions"] == 2
    pod = job["template"]["spec"]
    assert pod["nodeSelector"] == {"cloud.google.com/gke-tpu-accelerator": "tpu-v5p-slice",
                                   "cloud.google.com/gke-tpu-topology": "2x2x2"}
    (c,) = pod["containers"]
    assert c["resources"]["limits"]["google.com/tpu"] == "4"
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert (env["MEGASCALE_SLICE_ID"], env["MEGASCALE_NUM_SLICES"]) == ("2", "3")
    assert "--resource_manager_address=$(PATHWAYS_HEAD):29001" in c["args"]
    assert env["PATHWAYS_HEAD"] == "tpu-job-controller.$(POD_NAMESPACE).svc"


def test_controller_pod_points_jax_at_the_local_proxy_and_stays_off_tpu_nodes():
    pod = PathwaysRenderer().controller_pod(pathways_job(), attempt=1)
    (controller,) = pod["spec"]["containers"]
    assert controller["image"] == "ghcr.io/example/trainer:1.0"
    env = {e["name"]: e.get("value") for e in controller["env"]}
    assert env["JAX_PLATFORMS"] == "proxy" and env["JAX_BACKEND_TARGET"] == "grpc://127.0.0.1:29000"
    assert controller["env"][-1] == {"name": "USER_VAR", "value": "1"}  # user env last: it can override
    rm, proxy = pod["spec"]["initContainers"]
    assert rm["restartPolicy"] == proxy["restartPolicy"] == "Always"  # sidecars: the pod ends with the controller
    assert "--instance_type=tpuv5e:2x2" in rm["args"] and "--instance_count=2" in rm["args"]
    terms = pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert terms["nodeSelectorTerms"][0]["matchExpressions"][0]["operator"] == "DoesNotExist"


def test_service_exposes_the_resource_manager():
    svc = children.controller_service(pathways_job())
    assert [p["port"] for p in svc["spec"]["ports"]] == [8080, 29001]


def test_images_default_to_pathways_and_proxy_follows_a_pinned_server_tag():
    assert server_image(pathways_job()) == "us-docker.pkg.dev/cloud-tpu-v2-images/pathways/server:latest"
    pinned = pathways_job(worker={"image": "us-docker.pkg.dev/cloud-tpu-v2-images/pathways/server:2025-06-01"})
    assert proxy_image(pinned) == "us-docker.pkg.dev/cloud-tpu-v2-images/pathways/proxy_server:2025-06-01"


def test_tpu_example_renders():
    example = Path(__file__).resolve().parents[2] / "examples" / "02-tpu-v5e-pathways.yaml"
    job = backends.resolve(parse_manifest(yaml.safe_load(example.read_text())))
    assert (job.spec.slices.count, job.spec.slices.hosts_per_slice, job.spec.slices.devices_per_host) == (2, 1, 4)
    assert [o["kind"] for o in children.render_children(job, TOKEN)][-2:] == ["JobSet", "JobSet"]


def test_pathways_pods_keep_only_what_pathways_needs_beyond_restricted():
    from tests.support.pod_security import baseline_violations, restricted_violations

    job = pathways_job()
    controller = renderer_for("pathways").controller_pod(job, 0)["spec"]
    assert controller["automountServiceAccountToken"] is False
    # Our controller container is fully restricted; Google's head images run as their own (root) user.
    assert restricted_violations(controller) == [
        "Running as Non-root: initContainers[pathways-rm]", "Running as Non-root: initContainers[pathways-proxy]"]
    worker = renderer_for("pathways").worker_jobset(job, 0)["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    assert worker["automountServiceAccountToken"] is False
    assert baseline_violations(worker) == ["Host Namespaces: spec.hostNetwork"]  # both references use it
    assert not any("Privileged" in v or "Escalation" in v or "Seccomp" in v for v in restricted_violations(worker))
