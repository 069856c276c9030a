"""The pathways renderer: golden files of every child for four slice shapes, the TPU table, the errors.

Golden files are in tests/unit/golden/pathways/<case>.yaml: the
backend-dependent children of one job (Service, controller Pod, one JobSet
per slice) as a YAML stream. After an intended change to the rendering, regenerate them and
review the diff:

    UPDATE_GOLDEN=1 .venv/bin/python -m pytest -q tests/unit/test_operator_pathways.py
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from elastic_jax.api import labels
from elastic_jax.api.manifest import parse_manifest
from elastic_jax.api.manifest_digest import manifest_digest
from elastic_jax.cli import app
from elastic_jax.k8s_operator import backends, children
from elastic_jax.k8s_operator.backends import UnsupportedBackend, renderer_for
from elastic_jax.k8s_operator.backends.pathways import PathwaysRenderer, proxy_image, server_image
from elastic_jax.api.tpu_shapes import GENERATIONS, SliceShapeError, slice_shape

GOLDEN = Path(__file__).parent / "golden" / "pathways"
TOKEN = "golden-token"
JOB_UID = "0b5e4c1a-golden-job-uid"
# The peers the chart gives the operator by default (release `ej` in namespace `elastic-jax`).
CONTROL_API_FROM = [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "elastic-jax"}},
                     "podSelector": {"matchLabels": {"app.kubernetes.io/name": "elastic-jax",
                                                     "app.kubernetes.io/instance": "ej",
                                                     "app.kubernetes.io/component": "operator"}}}]


def pathways_job(accelerator="tpu-v5-lite-podslice", topology="2x2", count=2, name="tpu-job", **spec):
    """A parsed pathways job (namespace `ml`), `spec` merged over a small base."""
    base = {
        "backend": "pathways",
        "slices": {"count": count, "minSlices": 1, "accelerator": accelerator, "topology": topology},
        "controller": {"image": "ghcr.io/example/trainer:1.0",
                       "trainer": {"entryPoint": "elastic_jax.controller.builtin_lm:make_trainer"},
                       "env": [{"name": "USER_VAR", "value": "1"}], "resources": {"requests": {"cpu": "4"}}},
        # (a multiple of every count x chips used here, up to 64 slices of 16x16: equal shares per chip)
        "training": {"steps": 1000, "globalBatchSize": 3 * 64 * 256},
        "checkpoint": {"uri": "gs://my-bucket/tpu-job"},
    }
    for key, value in spec.items():
        base[key] = {**base[key], **value} if isinstance(base.get(key), dict) else value
    return parse_manifest({"apiVersion": "elasticjax.dev/v1alpha1", "kind": "ElasticTrainingJob",
                           "metadata": {"name": name, "namespace": "ml", "uid": JOB_UID}, "spec": base})


def example_job(filename: str):
    """A parsed job from examples/ (namespace `ml`, the golden uid), as the operator sees it once applied."""
    manifest = yaml.safe_load((Path(__file__).resolve().parents[2] / "examples" / filename).read_text())
    manifest["metadata"].update(namespace="ml", uid=JOB_UID)
    return parse_manifest(manifest)


# (golden file, job): v5e 2x2 x 2 slices, the v5e 4x8 (8 hosts) x 2 of issue 10, a multi-host v5p, a
# multi-host v6e. Every field that differs from pathways-utils' builder: docs/pathways.md.
CASES = {
    "v5e-2x2-x2": lambda: pathways_job("tpu-v5-lite-podslice", "2x2", count=2),
    "v5e-4x8-x2": lambda: pathways_job("tpu-v5-lite-podslice", "4x8", count=2),
    "v5p-2x2x2-x2": lambda: pathways_job("tpu-v5p-slice", "2x2x2", count=2),
    # MaxText's trainer as the controller command (library mode), at the Pathways release of its jax.
    "example-03-maxtext": lambda: example_job("03-maxtext-pathways.yaml"),
    # Two slices that train and one hot spare: three JobSets, the head sized for three.
    "v5e-2x2-x2-spare1": lambda: pathways_job("tpu-v5-lite-podslice", "2x2", count=2, slices={"spares": 1}),
    # The controller's compilation cache on an admin-allowed claim instead of under the checkpoint URI.
    "v5e-2x2-x2-cache-claim": lambda: pathways_job("tpu-v5-lite-podslice", "2x2", count=2, compilationCache={
        "persistentVolumeClaim": {"claimName": "xla-cache"}}),
    "v6e-4x4-x3": lambda: pathways_job("tpu-v6e-slice", "4x4", count=3,
                                       worker={"image": "us-docker.pkg.dev/cloud-tpu-v2-images/pathways/server:2025-06-01",
                                               "env": [{"name": "W", "value": "x"}]}),
}


def render(job) -> str:
    """The Services, the NetworkPolicy, controller Pod and slice JobSets, as the YAML stream the golden files hold.

    Secret and ConfigMap are left out: they do not depend on the backend (the
    ConfigMap holds every spec default, which would tie these files to
    unrelated API changes) and tests/unit/test_operator_render.py covers them.
    """
    resolved = backends.resolve(job)
    objs = children.render_children(resolved, token=TOKEN, job_uid=JOB_UID, control_api_from=CONTROL_API_FROM)
    text = GOLDEN_HEADER + yaml.safe_dump_all([o for o in objs if o["kind"] not in ("Secret", "ConfigMap")],
                                              sort_keys=False)
    # The manifest digest covers every spec default, like the ConfigMap: a placeholder keeps these files
    # about the backend (tests/unit/test_manifest_digest.py covers the digest).
    return text.replace(manifest_digest(resolved), "<sha256 of the spec>")


GOLDEN_HEADER = ("# Generated by tests/unit/test_operator_pathways.py (UPDATE_GOLDEN=1). Every field that differs\n"
                 "# from pathways-utils' GKE JobSet builder (pathwaysutils/experimental/gke/jobset.py) is listed,\n"
                 "# with the reason, in docs/pathways.md, section \"Differences from the references\".\n")


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


@pytest.mark.parametrize("accelerator, topology, hosts, chips_per_host, instance_type", [
    # issue 29 fault 5: 2x4 is GKE's single-host 8-chip machine (ct5lp-hightpu-8t, ct6e-standard-8t); it
    # rendered as 2 hosts x 4 chips, a shape no node pool of that topology has.
    ("tpu-v5-lite-podslice", "2x4", 1, 8, "tpuv5e1t:2x4"),
    ("tpu-v6e-slice", "2x4", 1, 8, "tpuv6e1t:2x4"),
    # the multi-host and 4-chip shapes of the same generations are unchanged
    ("tpu-v5-lite-podslice", "2x2", 1, 4, "tpuv5e:2x2"),
    ("tpu-v5-lite-podslice", "4x4", 4, 4, "tpuv5e:4x4"),
    ("tpu-v6e-slice", "4x8", 8, 4, "tpuv6e:4x8"),
    ("tpu-v6e-slice", "4x2", 2, 4, "tpuv6e:4x2"),
])
def test_eight_chip_single_host_shapes(accelerator, topology, hosts, chips_per_host, instance_type):
    shape = slice_shape(accelerator, topology)
    assert (shape.hosts, shape.chips_per_host, shape.chips, shape.instance_type) == (
        hosts, chips_per_host, hosts * chips_per_host, instance_type)


def test_table_has_the_generations_the_issue_names():
    assert {"tpu-v5-lite-podslice", "tpu-v5p-slice", "tpu-v6e-slice", "tpu7x"} <= set(GENERATIONS)


@pytest.mark.parametrize("accelerator, topology, message", [
    ("tpu-v9-imaginary", "2x2", "spec.slices.accelerator 'tpu-v9-imaginary' is not a TPU accelerator this operator knows (known: "),
    ("nvidia-h100", "2x2", "spec.slices.accelerator 'nvidia-h100'"),
    ("tpu-v5-lite-podslice", "2by2", "spec.slices.topology '2by2' must look like AxB or AxBxC"),
    ("tpu-v5-lite-podslice", "0x2", "spec.slices.topology '0x2' must look like AxB"),
    ("tpu-v5-lite-podslice", "2x2x2", "spec.slices.topology '2x2x2' must have 2 dimensions for tpu-v5-lite-podslice (e.g. 2x2)"),
    ("tpu-v5p-slice", "2x2", "spec.slices.topology '2x2' must have 3 dimensions for tpu-v5p-slice (e.g. 2x2x2)"),
    ("tpu-v5-lite-podslice", "1x1", "spec.slices.topology '1x1' has 1 chips, not a multiple of the 4 chips per host of tpu-v5-lite-podslice; a slice smaller than one host (a 1-chip machine type such as ct5lp-hightpu-1t) has no Pathways instance type"),
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


def test_a_global_batch_the_chips_do_not_share_is_refused_naming_the_field(tmp_path):
    # 2 slices x 4 chips (v5e 2x2): the pathways backend shards 260 over slices only, each chip running 130
    message = ("spec.training.globalBatchSize (260) must be a multiple of spec.slices.count (2) x the chips of "
               "tpu-v5-lite-podslice 2x2 (4) = 8, e.g. 256 or 264")
    with pytest.raises(UnsupportedBackend, match=re.escape(message)):
        backends.resolve(pathways_job(training={"globalBatchSize": 260}))
    # library mode: your program shards its own batches
    backends.resolve(pathways_job(training={"globalBatchSize": 260}, controller={"command": ["python", "t.py"],
                                                                                 "trainer": None}))
    manifest = yaml.safe_load((Path(__file__).resolve().parents[2] / "examples" / "02-tpu-v5e-pathways.yaml").read_text())
    manifest["spec"]["training"]["globalBatchSize"] = 260
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(manifest))
    result = CliRunner().invoke(app, ["validate", str(tmp_path / "job.yaml")])
    assert result.exit_code == 2 and result.output.count("error:") == 1, result.output
    assert f"error: {tmp_path / 'job.yaml'}: {message}" in result.output and "Traceback" not in result.output


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
    # restart in place (pathways-utils): the Job's budget is hosts x maxRestartsPerSlice (default 10)
    assert job["backoffLimit"] == 2 * 10
    pod = job["template"]["spec"]
    assert pod["restartPolicy"] == "OnFailure"
    assert pod["terminationGracePeriodSeconds"] == 30
    assert pod["nodeSelector"] == {"cloud.google.com/gke-tpu-accelerator": "tpu-v5p-slice",
                                   "cloud.google.com/gke-tpu-topology": "2x2x2"}
    (c,) = pod["containers"]
    assert c["resources"]["limits"]["google.com/tpu"] == "4"
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert (env["MEGASCALE_SLICE_ID"], env["MEGASCALE_NUM_SLICES"]) == ("2", "3")
    assert "--resource_manager_address=$(PATHWAYS_HEAD):29001" in c["args"]
    assert env["PATHWAYS_HEAD"] == "tpu-job-pathways-head.$(POD_NAMESPACE).svc"


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


def test_workers_reach_the_resource_manager_by_a_name_published_before_the_head_is_ready():
    """Issue 10 item 1: the controller Service routes only to a Ready pod, and the controller is Ready only
    once the workers registered; the workers' route is a headless Service publishing not-ready addresses."""
    job = pathways_job()
    assert [p["port"] for p in children.controller_service(job)["spec"]["ports"]] == [8080]
    head = next(o for o in children.static_children(job) if o["metadata"]["name"] == "tpu-job-pathways-head")
    assert head["spec"]["clusterIP"] == "None" and head["spec"]["publishNotReadyAddresses"] is True
    assert [p["port"] for p in head["spec"]["ports"]] == [29001, 29002]
    pod = PathwaysRenderer().controller_pod(job, attempt=3)
    assert head["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    rm = pod["spec"]["initContainers"][0]
    assert {p["containerPort"] for p in rm["ports"]} == {p["targetPort"] for p in head["spec"]["ports"]}
    # the resource manager's own address is the same name
    assert {"name": "HOST_ADDRESS", "value": "$(PATHWAYS_HEAD)"} in rm["env"]
    assert {"name": "PATHWAYS_HEAD", "value": "tpu-job-pathways-head.$(POD_NAMESPACE).svc"} in rm["env"]


def test_resource_manager_has_a_startup_probe_on_its_port():
    """Issue 10 item 5: the controller container starts after it (native sidecar order), and the operator
    reads its `started` before it creates any worker JobSet."""
    rm = PathwaysRenderer().controller_pod(pathways_job(), attempt=0)["spec"]["initContainers"][0]
    assert rm["name"] == "pathways-rm"
    assert rm["startupProbe"]["tcpSocket"] == {"port": 29001}
    assert "readinessProbe" not in rm  # readiness of the pod is the controller's alone


def test_hot_spares_are_slices_the_head_is_sized_for():
    """Issue 12 item 2 on pathways: a spare is a JobSet on its own node pool, registered with the resource
    manager like the others, so the resource manager, the proxy and Megascale count count + spares slices."""
    job = pathways_job(count=2, slices={"spares": 1})
    objs = children.render_children(backends.resolve(job), token=TOKEN, job_uid=JOB_UID)
    jobsets = [o for o in objs if o["kind"] == "JobSet"]
    assert [js["metadata"]["labels"][labels.SLICE_INDEX] for js in jobsets] == ["0", "1", "2"]
    rm, proxy = next(o for o in objs if o["kind"] == "Pod")["spec"]["initContainers"]
    assert "--instance_count=3" in rm["args"] and "--num_elastic_slices=3" in proxy["args"]
    for i, js in enumerate(jobsets):
        assert js["metadata"]["annotations"] == {labels.JOBSET_EXCLUSIVE_TOPOLOGY: "cloud.google.com/gke-nodepool"}
        (c,) = js["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"]
        env = {e["name"]: e.get("value") for e in c["env"]}
        assert (env["MEGASCALE_SLICE_ID"], env["MEGASCALE_NUM_SLICES"]) == (str(i), "3")


def test_checkpoints_use_pathways_persistence():
    """Issue 10 item 6: Orbax writes arrays from the TPU workers, not through the proxy."""
    (controller,) = PathwaysRenderer().controller_pod(pathways_job(), attempt=0)["spec"]["containers"]
    assert {"name": "ENABLE_PATHWAYS_PERSISTENCE", "value": "1"} in controller["env"]


def test_worker_grace_period_is_a_spec_field():
    """Issue 10 item 7: 30 s by default (not the cpu workers' 5 s), spec.worker.terminationGracePeriodSeconds wins."""
    def grace(job):
        return PathwaysRenderer().worker_jobset(job, 0)["spec"]["replicatedJobs"][0]["template"]["spec"][
            "template"]["spec"]["terminationGracePeriodSeconds"]

    assert grace(pathways_job()) == 30
    assert grace(pathways_job(worker={"terminationGracePeriodSeconds": 300})) == 300


def test_images_default_to_the_release_of_the_pinned_jax_and_proxy_follows_a_pinned_server_tag():
    """Issue 10 item 9: never `latest`; one table (`images.PATHWAYS_RELEASES`) keyed by the jax pin."""
    from elastic_jax.api import images

    assert server_image(pathways_job()) == f"us-docker.pkg.dev/cloud-tpu-v2-images/pathways/server:jax-{images.PINNED_JAX}"
    assert proxy_image(pathways_job()) == \
        f"us-docker.pkg.dev/cloud-tpu-v2-images/pathways/proxy_server:jax-{images.PINNED_JAX}"
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
    assert baseline_violations(worker) == ["Host Namespaces: spec.hostNetwork"]  # google/pathways-job uses it
    assert not any("Privileged" in v or "Escalation" in v or "Seccomp" in v for v in restricted_violations(worker))


def test_user_worker_selectors_are_added_to_the_tpu_ones_never_replace_them():
    job = backends.resolve(pathways_job(worker={"nodeSelector": {"team": "ml"},
                                                "tolerations": [{"key": "spot", "operator": "Exists"}]},
                                        imagePullSecrets=[{"name": "ar"}]))
    pod = PathwaysRenderer().worker_jobset(job, 0)["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"team": "ml", "cloud.google.com/gke-tpu-accelerator": "tpu-v5-lite-podslice",
                                   "cloud.google.com/gke-tpu-topology": "2x2"}
    assert pod["tolerations"] == [{"key": "spot", "operator": "Exists"}]
    assert pod["imagePullSecrets"] == [{"name": "ar"}]
    ctl = PathwaysRenderer().controller_pod(job, 0)["spec"]
    assert ctl["imagePullSecrets"] == [{"name": "ar"}]
    # The controller keeps its "off the TPU pools" affinity whatever its own selectors.
    assert ctl["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0][
        "matchExpressions"] == [{"key": "cloud.google.com/gke-tpu-accelerator", "operator": "DoesNotExist"}]


@pytest.mark.parametrize(("spec", "message"), [
    ({"worker": {"nodeSelector": {"cloud.google.com/gke-tpu-accelerator": "tpu-v6e-slice"}}},
     "spec.worker.nodeSelector['cloud.google.com/gke-tpu-accelerator']: the operator sets this TPU selector"),
    ({"worker": {"nodeSelector": {"cloud.google.com/gke-tpu-topology": "2x2"}}},
     "spec.worker.nodeSelector['cloud.google.com/gke-tpu-topology']: the operator sets this TPU selector"),
    ({"controller": {"nodeSelector": {"cloud.google.com/gke-tpu-accelerator": "tpu-v5-lite-podslice"}}},
     "spec.controller.nodeSelector['cloud.google.com/gke-tpu-accelerator']: the pathways controller runs off the TPU"),
])
def test_a_user_selector_on_a_tpu_label_is_refused_naming_the_field(spec, message):
    with pytest.raises(UnsupportedBackend, match=re.escape(message)):
        backends.resolve(pathways_job(**spec))


@pytest.mark.parametrize("accelerator, topology", [
    ("tpu-v5-lite-podslice", "2x2"), ("tpu-v5-lite-podslice", "4x8"), ("tpu-v5p-slice", "2x2x2"),
    ("tpu-v6e-slice", "4x4"), ("tpu-v5-lite-podslice", "16x16"),
])
def test_the_longest_accepted_name_fits_every_child_of_every_shape(accelerator, topology):
    """Issue 10 item 8: issue 9's rule (DNS-1035, at most MAX_NAME_LENGTH) is computed from the largest shape,
    so no TPU shape makes a pod name exceed 63 (JobSet's webhook refuses that) or a Service name invalid."""
    from elastic_jax.api.job import MAX_NAME_LENGTH

    name = "a" * MAX_NAME_LENGTH
    job = backends.resolve(pathways_job(accelerator, topology, count=64, name=name))
    objs = children.render_children(job, TOKEN)
    for o in objs:
        assert len(o["metadata"]["name"]) <= 63, o["metadata"]["name"]
    hosts = job.spec.slices.hosts_per_slice
    last = objs[-1]
    # JobSet's pod names: <jobset>-<replicated job>-<job index>-<pod index>-<5 random>
    pod = f"{last['metadata']['name']}-{last['spec']['replicatedJobs'][0]['name']}-0-{hosts - 1}-abcde"
    assert len(pod) <= 63, pod
    with pytest.raises(Exception, match="at most"):
        pathways_job(accelerator, topology, name="a" * (MAX_NAME_LENGTH + 1))
    with pytest.raises(Exception, match="DNS-1035"):
        pathways_job(accelerator, topology, name="1" + "a" * 5)


def test_the_controller_caches_under_the_checkpoint_uri_or_where_the_spec_says():
    def cache_env(job):
        pod = PathwaysRenderer().controller_pod(job, 0)
        return {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}["JAX_COMPILATION_CACHE_DIR"]

    assert cache_env(pathways_job(checkpoint={"uri": "gs://my-bucket/tpu-job/"})) == \
        "gs://my-bucket/tpu-job/compilation-cache"
    assert cache_env(pathways_job(compilationCache={"uri": "gs://cache-bucket/xla"})) == "gs://cache-bucket/xla"
    # Pathways workers compile nothing of ours: no cache env, no cache volume.
    js = PathwaysRenderer().worker_jobset(pathways_job(compilationCache={"persistentVolumeClaim": {"claimName": "c"}}), 0)
    pod = js["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    assert "volumes" not in pod
    assert "JAX_COMPILATION_CACHE_DIR" not in {e["name"] for e in pod["containers"][0]["env"]}
