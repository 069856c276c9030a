"""Spec → children: the pure renderers of the operator."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest
import yaml

from elastic_jax import contract
from elastic_jax.api import labels
from elastic_jax.api.manifest import parse_manifest
from elastic_jax.k8s_operator import backends, children, names
from elastic_jax.k8s_operator.backends import UnsupportedBackend, renderer_for


def _job(**spec):
    base = {"slices": {"count": 2, "minSlices": 1, "devicesPerHost": 2},
            "training": {"steps": 10, "globalBatchSize": 4}, "checkpoint": {"uri": "/tmp/ck"},
            "elasticity": {"maxRestartsPerSlice": 7},
            "worker": {"env": [{"name": "A", "value": "1"}], "resources": {"limits": {"memory": "2Gi"}}}}
    base.update(spec)
    return parse_manifest({"apiVersion": "elasticjax.dev/v1alpha1", "kind": "ElasticTrainingJob",
                           "metadata": {"name": "demo", "namespace": "ns"}, "spec": base})


def test_every_child_is_rendered_with_job_labels():
    objs = children.render_children(_job(), token="s3cret")
    kinds = [o["kind"] for o in objs]
    assert kinds == ["Secret", "ConfigMap", "Service", "Pod", "JobSet", "JobSet"]
    for o in objs:
        assert o["metadata"]["labels"][labels.JOB_NAME] == "demo"
    spares = children.render_children(_job(slices={"count": 2, "spares": 1}), token="t")
    assert [o["metadata"]["name"] for o in spares if o["kind"] == "JobSet"] == [
        "demo-slice-0", "demo-slice-1", "demo-slice-2"]


def test_secret_holds_the_token_and_configmap_the_manifest():
    job = _job()
    secret = children.token_secret(job, "s3cret")
    assert base64.b64decode(secret["data"]["token"]).decode() == "s3cret"
    cm = children.manifest_configmap(job)
    manifest = yaml.safe_load(cm["data"]["job.yaml"])
    assert parse_manifest(manifest).spec == job.spec  # the controller reads the same spec
    assert cm["metadata"]["annotations"][labels.SPEC_HASH] == children.spec_hash(job)


def test_spec_hash_ignores_suspend_and_ttl_only():
    job = _job()
    assert children.spec_hash(job) == children.spec_hash(_job(suspend=True, ttlSecondsAfterFinished=5))
    assert children.spec_hash(job) != children.spec_hash(_job(training={"steps": 11, "globalBatchSize": 4}))


def test_controller_pod_never_restarts_by_itself_and_binds_all_addresses():
    pod = renderer_for("cpu").controller_pod(_job(), attempt=3)
    assert pod["metadata"]["name"] == "demo-controller-3"
    assert pod["metadata"]["labels"][labels.CONTROLLER_ATTEMPT] == "3"
    spec = pod["spec"]
    assert spec["restartPolicy"] == "Never"
    c = spec["containers"][0]
    env = {e["name"]: e.get("value", e.get("valueFrom")) for e in c["env"]}
    assert env["POD_IP"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    # All addresses: kubectl port-forward connects to the pod's loopback (docs/kubernetes.md "Reaching a controller").
    assert env[contract.ENV_HOST] == "0.0.0.0"
    assert env[contract.ENV_MANIFEST] == f"{names.MANIFEST_DIR}/job.yaml"
    assert env[contract.ENV_TOKEN_FILE] == f"{names.TOKEN_DIR}/token"
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
    # One slow answer on a loaded node must not pull the controller out of its Service's endpoints.
    assert c["readinessProbe"]["timeoutSeconds"] >= 5 and c["readinessProbe"]["failureThreshold"] >= 3
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes["token"]["secret"]["secretName"] == "demo-token"
    assert volumes["manifest"]["configMap"]["name"] == "demo-manifest"


def test_worker_jobset_per_slice_with_budget_and_probe():
    js = renderer_for("cpu").worker_jobset(_job(), 1)
    assert js["apiVersion"] == contract.JOBSET_API_VERSION
    assert js["metadata"]["name"] == "demo-slice-1"
    assert js["metadata"]["labels"][labels.SLICE_INDEX] == "1"
    assert js["spec"]["failurePolicy"] == {"maxRestarts": 7}
    rj = js["spec"]["replicatedJobs"][0]
    assert rj["replicas"] == 1
    job_spec = rj["template"]["spec"]
    assert job_spec["backoffLimit"] == 0 and job_spec["parallelism"] == 1
    pod = job_spec["template"]
    assert pod["metadata"]["labels"] == {labels.JOB_NAME: "demo", labels.ROLE: "worker", labels.SLICE_INDEX: "1"}
    c = pod["spec"]["containers"][0]
    assert c["args"] == ["--host", "$(POD_IP)", "--port", str(names.WORKER_PORT), "--slice-index", "1", "--host-devices", "2"]
    assert c["readinessProbe"] == {"tcpSocket": {"port": names.WORKER_PORT}, "periodSeconds": 1, "failureThreshold": 1}
    assert {"name": "A", "value": "1"} in c["env"]
    # The memory limit is the user's; cpu had neither request nor limit, so the default request applies.
    assert c["resources"] == {"requests": {"cpu": "250m"}, "limits": {"memory": "2Gi"}}
    assert pod["spec"]["restartPolicy"] == "Never"


def test_unknown_backend_is_refused_clearly():
    # pathways is rendered now (tests/unit/test_operator_pathways.py); the refusal path stays.
    with pytest.raises(UnsupportedBackend, match=r"spec.backend 'gpu' is not supported"):
        renderer_for("gpu")


def test_every_backend_the_rules_accept_has_a_renderer():
    """`validate` accepts the backends of `backend_rules.SUPPORTED_BACKENDS`; the operator renders each."""
    from elastic_jax.api.backend_rules import SUPPORTED_BACKENDS
    from elastic_jax.k8s_operator.backends import RENDERERS

    assert set(RENDERERS) == set(SUPPORTED_BACKENDS)


def _scribble(obj):
    """Empties every dict and list inside `obj`, innermost first (what a careless caller's edit could do)."""
    items = obj.values() if isinstance(obj, dict) else obj if isinstance(obj, list) else ()
    for value in list(items):
        _scribble(value)
    if isinstance(obj, (dict, list)):
        obj.clear()


@pytest.mark.parametrize("backend", ["cpu", "pathways"])
def test_every_rendered_object_is_its_own_so_an_edit_never_reaches_the_next_job(backend):
    """The renderers build pods from module-level constants; a CI run had the head's resource limits empty
    in every render after an e2e test edited one rendered container. Every object a render returns is now
    its own: emptying all of them leaves the next render as it was."""
    from tests.unit.test_operator_pathways import pathways_job

    job = pathways_job() if backend == "pathways" else _job()
    peers = [{"podSelector": {"matchLabels": {"app": "op"}}}]

    def everything():
        # (the renderer's class itself, as an e2e test uses it, and as the operator gets it)
        r = type(renderer_for(backend))()
        return [*children.static_children(job, peers), r.controller_pod(job, 0, "u1"),
                *(r.worker_jobset(job, i) for i in range(job.spec.slices.total))]

    first = everything()
    expected = yaml.safe_dump_all(first)
    _scribble(first)
    assert yaml.safe_dump_all(everything()) == expected


def test_service_selects_the_controller():
    svc = children.controller_service(_job())
    assert svc["spec"]["selector"] == {labels.JOB_NAME: "demo", labels.ROLE: "controller"}
    assert svc["spec"]["ports"][0]["port"] == names.CONTROLLER_PORT


def _pod_names(jobset: dict) -> list[str]:
    """The longest names the Job and JobSet controllers give a JobSet's pods:
    `<jobset>-<replicatedjob>-<jobidx>-<podidx>-<5 random>` (JobSet's webhook checks this length)."""
    out = []
    for rj in jobset["spec"]["replicatedJobs"]:
        for job_index in range(rj["replicas"]):
            last_pod = rj["template"]["spec"]["completions"] - 1
            out.append(f"{jobset['metadata']['name']}-{rj['name']}-{job_index}-{last_pod}-abcde")
    return out


@pytest.mark.parametrize("backend", ["cpu", "pathways"])
def test_every_child_name_fits_63_for_the_longest_name_and_largest_shape(backend):
    from elastic_jax.api.job import MAX_NAME_LENGTH
    from elastic_jax.k8s_operator import backends

    name = "a" * MAX_NAME_LENGTH
    slices = {"count": 64, "devicesPerHost": 1}
    if backend == "pathways":
        # the most hosts one slice can have (v5p 8x8x16: 256 hosts of 4 chips)
        slices.update(accelerator="tpu-v5p-slice", topology="8x8x16")
    else:
        slices["hostsPerSlice"] = 1
    job = backends.resolve(parse_manifest({
        "apiVersion": "elasticjax.dev/v1alpha1", "kind": "ElasticTrainingJob",
        "metadata": {"name": name, "namespace": "ns"},
        "spec": {"backend": backend, "slices": slices, "training": {"steps": 1, "globalBatchSize": 64 * 1024},
                 "checkpoint": {"uri": "gs://test-bucket/c"}}}))
    objs = children.render_children(job, token="t", controller_attempt=99999)
    all_names = [o["metadata"]["name"] for o in objs]
    all_names += [n for o in objs if o["kind"] == "JobSet" for n in _pod_names(o)]
    longest = max(all_names, key=len)
    assert len(longest) <= 63, longest
    if backend == "pathways":
        assert len(longest) == 63  # the bound is tight: one more character would break a pod name


def _worker_pod_spec(jobset: dict) -> dict:
    return jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]


def test_cpu_pods_meet_pod_security_restricted():
    from tests.support.pod_security import restricted_violations

    for job in (_job(), _job(checkpoint={"uri": "gs://test-bucket/ck"}),
                _job(compilationCache={"persistentVolumeClaim": {"claimName": "xla-cache"}})):
        controller = renderer_for("cpu").controller_pod(job, 0)["spec"]
        worker = _worker_pod_spec(renderer_for("cpu").worker_jobset(job, 0))
        for spec in (controller, worker):
            assert restricted_violations(spec) == []
            assert spec["automountServiceAccountToken"] is False  # they never call the API
            assert spec["securityContext"]["fsGroup"] == 65532  # the 0440 token is readable by uid 65532
            c = spec["containers"][0]
            env = {e["name"]: e.get("value") for e in c["env"]}
            mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
            volumes = {v["name"]: v for v in spec["volumes"]}
            for var in ("HOME", "TMPDIR", "XDG_CACHE_HOME"):  # writable on a read-only root
                assert env[var].startswith(names.SCRATCH_DIR)
            assert "emptyDir" in volumes[mounts[names.SCRATCH_DIR]]
            assert volumes[mounts[names.TOKEN_DIR]]["secret"]["defaultMode"] == 0o440
        assert _worker_pod_spec(renderer_for("cpu").worker_jobset(job, 0))["containers"][0][
            "securityContext"]["readOnlyRootFilesystem"] is True
    # A gs:// checkpoint: nothing is written outside the scratch dir.
    gs = renderer_for("cpu").controller_pod(_job(checkpoint={"uri": "gs://test-bucket/ck"}), 0)["spec"]
    assert gs["containers"][0]["securityContext"]["readOnlyRootFilesystem"] is True
    assert "checkpoints" not in {v["name"] for v in gs["volumes"]}


def test_local_checkpoint_gets_an_emptydir_and_the_root_stays_read_only():
    spec = renderer_for("cpu").controller_pod(_job(checkpoint={"uri": "/data/run/ck/"}), 0)["spec"]
    c = spec["containers"][0]
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    assert "emptyDir" in {v["name"]: v for v in spec["volumes"]}[mounts["/data/run/ck"]]


@pytest.mark.parametrize("uri, message", [
    ("relative/ck", "must be an absolute folder"), ("/", "'/': the file system's root"),
    ("/etc/elastic-jax/token/x", "must not overlap /etc/elastic-jax/token"),
    ("/etc", "must not overlap /etc/elastic-jax/manifest"),
    (names.SCRATCH_DIR, f"must not overlap {names.SCRATCH_DIR}"), ("/tmp/", f"must not overlap {names.SCRATCH_DIR}"),
    # POSIX keeps a leading "//" through normpath (found on kind: the emptyDir covered the token):
    # such paths are refused outright, as the CRD's CEL refuses them.
    ("//etc/elastic-jax/token", "must be an absolute folder"), ("///tmp/../etc/elastic-jax", "a '..' segment"),
    ("/data/./ck", "must be an absolute folder"), ("/data//ck", "must be an absolute folder"),
    ("/usr/lib", "must not be inside /bin, .*/usr"), ("/opt/venv/ck", "must not be inside .*/opt"),
])
def test_unmountable_local_checkpoint_is_refused_naming_the_field(uri, message):
    from elastic_jax.k8s_operator.backends import resolve

    with pytest.raises(UnsupportedBackend, match=f"spec.checkpoint.uri: .*{message}"):
        resolve(_job_stored_before_the_uri_rules(uri))


def _job_stored_before_the_uri_rules(uri: str):
    """A job whose `spec.checkpoint.uri` is `uri`, built without the model's uri rules: `/` and `..` segments are
    refused by the model itself now (`checkpoints.URI_RULES`), but a job an older CRD admitted may still hold
    one, and the renderer's cluster rules are the backstop that keeps an emptyDir off `/` for it."""
    job = _job()
    checkpoint = job.spec.checkpoint.model_copy(update={"uri": uri})  # (model_copy validates nothing)
    return job.model_copy(update={"spec": job.spec.model_copy(update={"checkpoint": checkpoint})})


def test_pod_security_checker_catches_each_kind_of_violation():
    from tests.support.pod_security import restricted_violations

    pod = renderer_for("cpu").controller_pod(_job(), 0)["spec"]
    bad = {**pod, "hostNetwork": True, "hostPID": True, "volumes": [*pod["volumes"], {"name": "h", "hostPath": {"path": "/"}}],
           "securityContext": {"seccompProfile": {"type": "Unconfined"}},
           "containers": [{**pod["containers"][0], "securityContext": {"privileged": True, "capabilities": {"add": ["SYS_ADMIN"]}}}]}
    found = " ".join(restricted_violations(bad))
    for control in ("Host Namespaces: spec.hostNetwork", "spec.hostPID", "HostPath", "Volume Types", "Privileged",
                    "Capabilities", "Privilege Escalation", "Running as Non-root", "Seccomp"):
        assert control in found, control


@pytest.mark.parametrize("backend", ["cpu", "pathways"])
def test_pods_get_no_service_link_env(backend):
    # The kubelet injects <SERVICE>_PORT=tcp://... for every Service in the namespace; a
    # Service named elastic-jax-* would override ELASTIC_JAX_* settings (seen on kind).
    spec = {"backend": backend}
    if backend == "pathways":
        spec["slices"] = {"count": 2, "accelerator": "tpu-v5-lite-podslice", "topology": "2x2"}
        spec["training"] = {"steps": 10, "globalBatchSize": 8}
        spec["checkpoint"] = {"uri": "gs://bucket/ck"}
    job = _job(**spec)
    renderer = renderer_for(backend)
    pods = [renderer.controller_pod(job, 0)["spec"],
            renderer.worker_jobset(job, 0)["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]]
    assert all(p["enableServiceLinks"] is False for p in pods)


def test_controller_pod_is_told_the_jobs_identity_for_its_checkpoints():
    """Issue 9 item 13: the controller stores namespace/name/UID with each checkpoint step."""
    pod = renderer_for("cpu").controller_pod(_job(), attempt=0, job_uid="5f1d-uid")
    env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
    assert (env[contract.ENV_JOB_NAMESPACE], env[contract.ENV_JOB_NAME], env[contract.ENV_JOB_UID]) == (
        "ns", "demo", "5f1d-uid")


def test_pull_secrets_scheduling_and_priority_reach_both_pods():
    job = _job(imagePullSecrets=[{"name": "ar-pull"}], priorityClassName="training",
               controller={"nodeSelector": {"pool": "cpu"},
                           "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "ctl", "effect": "NoSchedule"}]},
               worker={"nodeSelector": {"pool": "workers"},
                       "tolerations": [{"operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 30}]})
    ctl = renderer_for("cpu").controller_pod(job, 0)["spec"]
    wrk = renderer_for("cpu").worker_jobset(job, 0)["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    for spec in (ctl, wrk):
        assert spec["imagePullSecrets"] == [{"name": "ar-pull"}]
        assert spec["priorityClassName"] == "training"
    assert ctl["nodeSelector"] == {"pool": "cpu"}
    assert ctl["tolerations"] == [{"key": "dedicated", "operator": "Equal", "value": "ctl", "effect": "NoSchedule"}]
    assert wrk["nodeSelector"] == {"pool": "workers"}
    assert wrk["tolerations"] == [{"operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 30}]
    # Nothing set: nothing rendered (a pod spec without these fields, as before).
    plain = renderer_for("cpu").controller_pod(_job(), 0)["spec"]
    assert not {"imagePullSecrets", "priorityClassName", "nodeSelector", "tolerations"} & set(plain)


def test_default_requests_fill_only_what_the_spec_leaves_unset():
    ctl = renderer_for("cpu").controller_pod(_job(), 0)["spec"]["containers"][0]
    assert ctl["resources"] == {"requests": {"cpu": "250m", "memory": "512Mi"}}
    job = _job(controller={"resources": {"requests": {"cpu": "2"}, "limits": {"memory": "8Gi"}}})
    ctl = renderer_for("cpu").controller_pod(job, 0)["spec"]["containers"][0]
    # cpu: the user's request; memory: the user's limit (Kubernetes requests the limit): no default added.
    assert ctl["resources"] == {"requests": {"cpu": "2"}, "limits": {"memory": "8Gi"}}


def test_every_variable_the_renderers_set_is_in_the_runtime_contract():
    # A user env entry naming any of these is refused by the model; this keeps the list whole.
    from elastic_jax.api import runtime_env
    from tests.unit.test_operator_pathways import pathways_job

    for backend, job in (("cpu", _job(compilationCache=CACHE_CLAIM)), ("pathways", pathways_job())):
        from elastic_jax.k8s_operator import backends
        job = backends.resolve(job)
        r = renderer_for(backend)
        ctl = r.controller_pod(job, 0)["spec"]["containers"][0]["env"]
        wrk = r.worker_jobset(job, 0)["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"][0]["env"]
        user = {e.name for e in job.spec.controller.env} | {e.name for e in job.spec.worker.env}
        for role, env in (("controller", ctl), ("worker", wrk)):
            for name in {e["name"] for e in env} - user:
                assert runtime_env.reserved_problem(name, role, backend), (backend, role, name)


def test_pod_listen_address_pod_ip_binds_the_pod_ip(monkeypatch):
    from elastic_jax.k8s_operator.backends import cpu
    monkeypatch.setattr(cpu, "LISTEN_ADDRESS", cpu.LISTEN_ADDRESSES["pod-ip"])
    env = {e["name"]: e.get("value") for e in renderer_for("cpu").controller_pod(_job(), 0)["spec"]["containers"][0]["env"]}
    assert env[contract.ENV_HOST] == "$(POD_IP)"


# -- spec.compilationCache ----------------------------------------------------------------------

CACHE_CLAIM = {"persistentVolumeClaim": {"claimName": "xla-cache"}}


def _worker_pod(job, index=0):
    return renderer_for("cpu").worker_jobset(job, index)["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]


def test_cpu_workers_of_every_slice_mount_the_cache_claim_and_point_jax_at_it():
    job = _job(compilationCache=CACHE_CLAIM)
    for index in (0, 1):
        spec = _worker_pod(job, index)["spec"]
        c = spec["containers"][0]
        env = {e["name"]: e.get("value") for e in c["env"]}
        assert env[contract.JAX_ENV_COMPILATION_CACHE_DIR] == contract.COMPILATION_CACHE_DIR
        assert env[contract.JAX_ENV_CACHE_MIN_COMPILE_TIME_SECS] == "0"  # every compile cached, as the launcher does
        assert {"name": "compilation-cache", "mountPath": contract.COMPILATION_CACHE_DIR} in c["volumeMounts"]
        assert {"name": "compilation-cache", "persistentVolumeClaim": {"claimName": "xla-cache"}} in spec["volumes"]
        # Writable by the non-root user through the pod's fsGroup; the root file system stays read-only.
        assert spec["securityContext"]["fsGroup"] == spec["securityContext"]["runAsUser"] == 65532
        assert c["securityContext"]["readOnlyRootFilesystem"] is True
        # No hostPath, whatever the spec says: only the named claim.
        assert not any("hostPath" in v for v in spec["volumes"])
    # The user's env still comes last, and the controller gets no cache (workers compile the step program).
    assert _worker_pod(job)["spec"]["containers"][0]["env"][-1] == {"name": "A", "value": "1"}
    ctl = renderer_for("cpu").controller_pod(job, 0)["spec"]
    assert contract.JAX_ENV_COMPILATION_CACHE_DIR not in {e["name"] for e in ctl["containers"][0]["env"]}


def test_cpu_workers_without_a_cache_spec_get_none():
    spec = _worker_pod(_job())["spec"]
    assert contract.JAX_ENV_COMPILATION_CACHE_DIR not in {e["name"] for e in spec["containers"][0]["env"]}
    assert [v["name"] for v in spec["volumes"]] == ["token", "scratch"]


def test_the_cache_mount_is_outside_every_folder_the_operator_mounts():
    from elastic_jax.api import cluster
    for folder in cluster.RESERVED_DIRS:
        assert not contract.COMPILATION_CACHE_DIR.startswith(folder.rstrip("/") + "/")
        assert not folder.startswith(contract.COMPILATION_CACHE_DIR)


@pytest.mark.parametrize("cache, message", [
    ({"uri": "gs://test-bucket/xla"}, "spec.compilationCache.uri: backend cpu reads its cache from a volume"),
    ({}, "spec.compilationCache needs exactly one of uri or persistentVolumeClaim"),
    ({"uri": "gs://test-bucket/x", **CACHE_CLAIM}, "spec.compilationCache needs exactly one of uri or persistentVolumeClaim"),
    ({"persistentVolumeClaim": {"claimName": "Bad_Name"}}, "spec.compilationCache.persistentVolumeClaim.claimName"),
    ({"hostPath": {"path": "/"}}, "hostPath"),
])
def test_a_bad_compilation_cache_is_refused_naming_the_field(cache, message):
    from elastic_jax.api.manifest import ManifestError
    with pytest.raises(ManifestError, match=message.replace(".", r"\.")):
        _job(compilationCache=cache)


@pytest.mark.parametrize("name", [contract.JAX_ENV_COMPILATION_CACHE_DIR, contract.JAX_ENV_CACHE_MIN_COMPILE_TIME_SECS])
def test_worker_env_cannot_point_jax_at_another_cache(name):
    from elastic_jax.api.manifest import ManifestError
    with pytest.raises(ManifestError, match=rf"spec\.worker\.env\[0\]\.name: {name} is set by the operator"):
        _job(worker={"env": [{"name": name, "value": "/tmp/mine"}]})


# -- `elastic-jax-operator render MANIFEST`: a job's children without a cluster ------------------------


def test_render_prints_what_the_operator_creates_for_an_example(capsys):
    """The children of examples/02 (pathways, 2 slices) as the operator renders them: namespaced, owned by
    the job (placeholder UID), the controller Pod the same as the renderer's, the token a placeholder."""
    import yaml as _yaml

    from elastic_jax.api.manifest import load_manifest
    from elastic_jax.k8s_operator import main as operator_main, render

    example = Path(__file__).resolve().parents[2] / "examples" / "02-tpu-v5e-pathways.yaml"
    assert operator_main.main(["render", str(example)]) == 0
    out, err = capsys.readouterr()
    assert err == "" and out.startswith("# rendered by elastic-jax-operator render ")
    objects = list(_yaml.safe_load_all(out))
    assert [o["kind"] for o in objects] == ["Secret", "ConfigMap", "Service", "Service", "Pod", "JobSet", "JobSet"]
    job = backends.resolve(load_manifest(example))
    for o in objects:
        assert o["metadata"]["namespace"] == (job.metadata.namespace or "default")
        assert o["metadata"]["ownerReferences"] == [{
            "apiVersion": "elasticjax.dev/v1alpha1", "kind": "ElasticTrainingJob", "name": job.metadata.name,
            "uid": render.PLACEHOLDER_UID, "controller": True, "blockOwnerDeletion": True}]
    pod = objects[4]
    job = job.model_copy(update={"metadata": job.metadata.model_copy(
        update={"namespace": pod["metadata"]["namespace"], "uid": render.PLACEHOLDER_UID})})
    expected = backends.renderer_for("pathways").controller_pod(job, 0, render.PLACEHOLDER_UID)
    assert pod["spec"] == expected["spec"] and pod["metadata"]["name"] == expected["metadata"]["name"]
    assert base64.b64decode(objects[0]["data"]["token"]).decode() == render.PLACEHOLDER_TOKEN


def test_render_adds_the_network_policies_of_the_operators_control_api_from(tmp_path, capsys):
    from elastic_jax.k8s_operator import main as operator_main

    example = Path(__file__).resolve().parents[2] / "examples" / "01-cpu-job.yaml"
    peers = '[{"podSelector": {"matchLabels": {"app": "op"}}}]'
    assert operator_main.main(["render", str(example), "--control-api-from", peers]) == 0
    kinds = [o["kind"] for o in yaml.safe_load_all(capsys.readouterr().out)]
    assert kinds.count("NetworkPolicy") == 2 and kinds.count("JobSet") == 2, kinds
    with pytest.raises(SystemExit) as e:
        operator_main.main(["render", str(example), "--control-api-from", "[1]"])
    assert e.value.code == 2 and "--control-api-from: item 0" in capsys.readouterr().err


def test_render_refuses_bad_input_with_one_line_each_and_prints_nothing(tmp_path, capsys):
    """The operator's own refusals (a relative checkpoint folder, an unknown TPU topology), as `error:` lines
    naming the file and the field, exit 2, no YAML on stdout."""
    from elastic_jax.k8s_operator import main as operator_main

    example = yaml.safe_load((Path(__file__).resolve().parents[2] / "examples" / "02-tpu-v5e-pathways.yaml").read_text())
    example["spec"]["slices"]["topology"] = "3x3"
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(example))
    assert operator_main.main(["render", str(bad)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith(f"error: {bad}: spec.slices.topology") and "Traceback" not in err, err
    assert operator_main.main(["render", str(tmp_path / "missing.yaml")]) == 2
    assert capsys.readouterr().err == f"error: {tmp_path / 'missing.yaml'}: cannot read manifest: No such file or directory\n"


def test_render_of_a_suspended_job_is_nothing_and_namespace_is_kubectls(tmp_path, capsys):
    """A new user's trial: a suspended job rendered six objects the operator never creates; and without
    `-n` the objects could not be matched to a job applied with `kubectl apply -n demo`."""
    from elastic_jax.k8s_operator import main as operator_main

    example = yaml.safe_load((Path(__file__).resolve().parents[2] / "examples" / "01-cpu-job.yaml").read_text())
    example["spec"]["suspend"] = True
    suspended = tmp_path / "suspended.yaml"
    suspended.write_text(yaml.safe_dump(example))
    assert operator_main.main(["render", str(suspended)]) == 0
    out = capsys.readouterr().out
    assert list(yaml.safe_load_all(out)) == [] and "spec.suspend is true: the operator creates nothing" in out
    example["spec"]["suspend"] = False
    suspended.write_text(yaml.safe_dump(example))
    assert operator_main.main(["render", str(suspended), "-n", "demo"]) == 0
    assert {o["metadata"]["namespace"] for o in yaml.safe_load_all(capsys.readouterr().out)} == {"demo"}
    # a namespace the API server would refuse is a usage error naming the flag (a trial: rendered, exit 0)
    with pytest.raises(SystemExit) as bad:
        operator_main.main(["render", str(suspended), "-n", "Bad_NS"])
    err = capsys.readouterr().err
    assert bad.value.code == 2 and "--namespace 'Bad_NS' must be a DNS-1123 label" in err and "Traceback" not in err
