"""Manifest validation: every mistake is one line naming the field."""

from pathlib import Path

import pytest

from elastic_jax import contract
from elastic_jax.api.job import located
from elastic_jax.api.manifest import ManifestError, load_manifest, parse_manifest

ROOT = Path(__file__).resolve().parents[2]


def _job(**spec_overrides):
    spec = {
        "slices": {"count": 2},
        "training": {"steps": 10, "globalBatchSize": 4},
        "checkpoint": {"uri": "/tmp/ckpt"},
    }
    spec.update(spec_overrides)
    return {"apiVersion": "elasticjax.dev/v1alpha1", "kind": "ElasticTrainingJob", "metadata": {"name": "t"}, "spec": spec}


@pytest.mark.parametrize("path", sorted((ROOT / "examples").glob("*cpu*.yaml")))
def test_examples_parse(path):
    job = load_manifest(path)
    assert job.spec.backend == "cpu"


def test_defaults_min_slices_is_count():
    job = parse_manifest(_job())
    assert job.spec.slices.minimum == 2
    assert job.spec.elasticity.max_restarts == 20


@pytest.mark.parametrize(
    "override, expected",
    [
        ({"slices": {"count": 0}}, "spec.slices.count: Input should be greater than or equal to 1"),
        ({"slices": {"count": 2, "minSlices": 3}}, "spec.slices.minSlices (3) must not exceed spec.slices.count (2)"),
        ({"bogus": 1}, "spec.bogus: unknown field"),
        ({"slices": {"count": 2, "cuont": 1}}, "spec.slices.cuont: unknown field"),
        ({"backend": "gpu"}, "spec.backend: Input should be 'cpu' or 'pathways'"),
        ({"slices": {"count": 5}}, "spec.training.globalBatchSize (4) must be at least spec.slices.count (5)"),
        ({"slices": {"count": 3}, "training": {"steps": 10, "globalBatchSize": 25}},
         "spec.training.globalBatchSize (25) must be a multiple of spec.slices.count (3), e.g. 24 or 27: the "
         "built-in loop gives every slice an equal share of each step's batch (25 / 3 = 8.333)"),
        ({"slices": {"count": 2, "devicesPerHost": 4}, "training": {"steps": 10, "globalBatchSize": 4}},
         "spec.training.globalBatchSize (4) must be a multiple of spec.slices.count (2) x spec.slices.devicesPerHost "
         "(4) = 8, e.g. 8: the built-in loop gives every slice and every device an equal share"),
        ({"slices": {"count": 2, "spares": -1}}, "spec.slices.spares: Input should be greater than or equal to 0"),
        ({"slices": {"count": 60, "spares": 8}, "training": {"steps": 10, "globalBatchSize": 120}},
         "spec.slices.spares: count + spares (60 + 8) must be at most 64"),
        ({"backend": "pathways"}, "backend pathways needs spec.slices.accelerator and spec.slices.topology"),
        ({"controller": {"trainer": {"entryPoint": "nocolon"}}}, "spec.controller.trainer.entryPoint 'nocolon' must look like"),
        # Types as the API server checks them: no string-to-number or string-to-bool coercion.
        ({"training": {"steps": "10", "globalBatchSize": 4}},
         "spec.training.steps: '10': must be an integer (a whole number, e.g. 10), not a string (quoted: write it "
         "without quotes)"),
        ({"suspend": "yes"}, "spec.suspend: 'yes': must be true or false, not a string"),
        # a JSON float where an integer is needed (issue 11: "Input should be a valid integer" said neither)
        ({"training": {"steps": 1.5, "globalBatchSize": 4}},
         "spec.training.steps: 1.5: must be an integer (a whole number, e.g. 10), not a fraction"),
        ({"slices": {"count": 2.5}}, "spec.slices.count: 2.5: must be an integer (a whole number, e.g. 10), not a fraction"),
        ({"elasticity": {"stepDeadlineSeconds": "ten"}},
         "spec.elasticity.stepDeadlineSeconds: 'ten': must be a number (e.g. 10 or 2.5), not a string"),
        # a new-user trial: `10s` was told "(quoted: write it without quotes)", and `count: -2` was not named
        ({"elasticity": {"stepDeadlineSeconds": "10s"}},
         "spec.elasticity.stepDeadlineSeconds: '10s': must be a number (e.g. 10 or 2.5), not a string (no unit: write 10)"),
        ({"slices": {"count": -2}}, "spec.slices.count: Input should be greater than or equal to 1 (got -2)"),
        ({"backend": "tpu"}, "spec.backend: Input should be 'cpu' or 'pathways' (got 'tpu')"),
        ({"worker": {"env": [{"name": "A", "value": True}]}},
         "spec.worker.env[0].value: true: must be a string, not a boolean (YAML reads an unquoted y"),
        ({"worker": {"env": [{"name": "A", "value": 3}]}}, "spec.worker.env[0].value: 3: must be a string, not a number"),
        # a whole float in a quantity: kubectl would pass it, a JSON client not; the message says what to write
        ({"worker": {"resources": {"requests": {"cpu": 1e3}}}},
         "spec.worker.resources.requests.cpu: 1000.0: must be an integer or a quoted string, e.g. 1000 or '1000', "
         "not a float"),
        ({"worker": {"resources": {"limits": {"memory": "4GB"}}}},
         "spec.worker.resources.limits.memory: '4GB' is not a non-negative Kubernetes quantity"),
        ({"worker": {"resources": {"limits": {"cpu": -1}}}},
         "spec.worker.resources.limits.cpu: -1 is not a non-negative Kubernetes quantity"),
        ({"worker": {"resources": {"requests": {"cpu": 0.5}}}},
         "spec.worker.resources.requests.cpu: 0.5: must be an integer or a quoted string; write a fraction as a "
         "string"),
    ],
)
def test_invalid_spec_names_field(override, expected):
    with pytest.raises(ManifestError) as info:
        parse_manifest(_job(**override), "job.yaml")
    message = str(info.value)
    assert expected in message
    assert "\n" not in message
    assert message.startswith("job.yaml: ")


def test_quantities_as_in_a_pod_spec():
    """`cpu: 2` (an int) is what users write in Pod specs; it is kept as the string "2"."""
    job = parse_manifest(_job(worker={"resources": {"requests": {"cpu": 2, "memory": "1.5Gi"},
                                                     "limits": {"cpu": "2500m", "example.com/gpu": 4}}}))
    assert job.spec.worker.resources.requests == {"cpu": "2", "memory": "1.5Gi"}
    assert job.spec.worker.resources.limits == {"cpu": "2500m", "example.com/gpu": "4"}


def test_yaml_timestamp_is_a_string_as_kubectl_sends_it():
    data = _job()
    data["metadata"]["annotations"] = {"started": __import__("datetime").date(2026, 1, 2)}
    assert parse_manifest(data).metadata.annotations == {"started": "2026-01-02"}


def test_bad_name_and_kind():
    data = _job()
    data["metadata"]["name"] = "Bad_Name"
    data["kind"] = "Job"
    message = str(pytest.raises(ManifestError, parse_manifest, data).value)
    assert "kind: Input should be 'ElasticTrainingJob'" in message
    assert "metadata.name 'Bad_Name' must be a DNS-1035 label" in message


def test_malformed_yaml(tmp_path):
    p = tmp_path / "bad.yaml"
    p.write_text("spec:\n  slices: [1,\n")
    message = str(pytest.raises(ManifestError, load_manifest, p).value)
    assert "malformed YAML" in message and "\n" not in message


def test_duplicate_key_is_refused_as_kubectl_refuses_it(tmp_path):
    p = tmp_path / "dup.yaml"
    p.write_text("apiVersion: elasticjax.dev/v1alpha1\nkind: ElasticTrainingJob\nmetadata: {name: t}\nspec:\n"
                 "  slices: {count: 2}\n  training:\n    steps: 60\n    steps: 5\n  checkpoint: {uri: /tmp/c}\n")
    message = str(pytest.raises(ManifestError, load_manifest, p).value)
    assert message == f"{p}: malformed YAML at line 8: key 'steps' appears twice in one mapping"


def test_missing_file_and_multiple_documents(tmp_path):
    assert "cannot read manifest" in str(pytest.raises(ManifestError, load_manifest, tmp_path / "nope.yaml").value)
    p = tmp_path / "two.yaml"
    p.write_text("a: 1\n---\nb: 2\n")
    assert "exactly one YAML document, found 2" in str(pytest.raises(ManifestError, load_manifest, p).value)


@pytest.mark.parametrize("source", ["sparse file", "/dev/zero"])
def test_a_manifest_larger_than_the_api_servers_request_limit_is_not_read(tmp_path, source):
    # A new user's trial: /dev/zero or a 2 GB file was read whole (MemoryError traceback, or all the RAM).
    if source == "/dev/zero":
        p = Path("/dev/zero")
    else:
        p = tmp_path / "big.yaml"
        with open(p, "wb") as f:
            f.truncate(2 * 1024**3)  # 2 GiB, sparse: costs no disk
    message = str(pytest.raises(ManifestError, load_manifest, p).value)
    assert message == f"{p}: larger than 3 MiB, the most a manifest may be (the API server's request limit): not read"


def test_binary_file(tmp_path):
    p = tmp_path / "b.yaml"
    p.write_bytes(bytes(range(256)) * 4)
    message = str(pytest.raises(ManifestError, load_manifest, p).value)
    assert "not a text file" in message


def _alias_bomb(levels: int, width: int = 9) -> str:
    """The issue's shape: a few hundred bytes of nested aliases under trainer.config
    that expand to width**levels nodes."""
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x]"]
    for i in range(1, levels):
        lines.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * width) + "]")
    body = "\n".join("      " + line for line in lines)
    return ("apiVersion: elasticjax.dev/v1alpha1\nkind: ElasticTrainingJob\nmetadata: {name: bomb}\n"
            "spec:\n  slices: {count: 1}\n  training: {steps: 1, globalBatchSize: 1}\n"
            "  checkpoint: {uri: /tmp/ck}\n  controller:\n    trainer:\n      entryPoint: m:f\n      config:\n"
            f"{body}\n")


def test_yaml_alias_bomb_is_refused_quickly_with_one_line(tmp_path):
    import time

    path = tmp_path / "bomb.yaml"
    path.write_text(_alias_bomb(9))  # 9**9 ≈ 387 million nodes once expanded
    assert len(path.read_bytes()) < 1000
    started = time.monotonic()
    with pytest.raises(ManifestError) as e:
        load_manifest(path)
    assert time.monotonic() - started < 2
    message = str(e.value)
    assert "\n" not in message and "alias" in message and str(path) in message


def test_too_many_aliases_are_refused(tmp_path):
    from elastic_jax.api import manifest

    anchors = "base: &b {k: v}\n" + "".join(f"u{i}: *b\n" for i in range(manifest.MAX_ALIASES + 1))
    with pytest.raises(Exception, match="aliases"):
        manifest.safe_load_bounded(anchors)


def test_a_few_aliases_still_load(tmp_path):
    from elastic_jax.api import manifest

    # (not `y:`: kubectl's YAML, and so this loader, reads the key y as the boolean true)
    doc = manifest.safe_load_bounded("base: &b {lr: 0.1, warm: 10}\nx: *b\nz: *b\n")
    assert doc["x"] == doc["z"] == {"lr": 0.1, "warm": 10}


def test_recursive_alias_is_refused():
    from elastic_jax.api import manifest

    with pytest.raises(Exception, match="recursive|alias"):
        manifest.safe_load_bounded("a: &a [1, *a]\n")


@pytest.mark.parametrize("name", ["1job", "job\n", "Job", "job-", "-job", "jo_b", "a" * 36, ""])
def test_job_names_outside_the_one_rule_are_refused(name):
    doc = _job()
    doc["metadata"]["name"] = name
    with pytest.raises(ManifestError, match="metadata.name") as e:
        parse_manifest(doc)
    assert "\n" not in str(e.value).replace(repr(name), "")


@pytest.mark.parametrize("name", ["j", "job-1", "a" * 35])
def test_job_names_within_the_rule_pass(name):
    doc = _job()
    doc["metadata"]["name"] = name
    assert parse_manifest(doc).metadata.name == name


@pytest.mark.parametrize("field", ["lables", "annotation", "nmae", "foo"])
def test_unknown_metadata_fields_are_refused_like_spec_fields(field):
    """`metadata.lables: {...}` was accepted silently (and the labels lost) while `spec` refuses unknown fields."""
    job = _job()
    job["metadata"][field] = {"team": "ml"}
    with pytest.raises(ManifestError) as e:
        parse_manifest(job)
    assert str(e.value) == f"manifest: metadata.{field}: unknown field"


def test_metadata_as_the_api_server_returns_it_is_accepted(tmp_path):
    """What `kubectl get ejob -o yaml` prints (every ObjectMeta field the API server or a controller sets)
    must still validate: the operator and `elastic-jax validate` read such objects."""
    path = tmp_path / "job.yaml"
    path.write_text("""\
apiVersion: elasticjax.dev/v1alpha1
kind: ElasticTrainingJob
metadata:
  name: t
  generateName: t-
  namespace: team-a
  uid: 6c1f0a8e-5d0b-4a57-9a39-2b8f6f0f6d41
  resourceVersion: "123456"
  generation: 3
  creationTimestamp: 2024-05-01T10:00:00Z
  deletionTimestamp: 2024-05-02T10:00:00Z
  deletionGracePeriodSeconds: 0
  selfLink: /apis/elasticjax.dev/v1alpha1/namespaces/team-a/elastictrainingjobs/t
  labels: {team: ml}
  annotations: {kopf.zalando.org/last-handled-configuration: '{"spec": {}}'}
  ownerReferences: [{apiVersion: v1, kind: ConfigMap, name: owner, uid: abc, controller: true}]
  finalizers: [elasticjax.dev/operator]
  managedFields:
  - {manager: kubectl-client-side-apply, operation: Update, apiVersion: elasticjax.dev/v1alpha1,
     time: 2024-05-01T10:00:00Z, fieldsType: FieldsV1, fieldsV1: {f:spec: {f:slices: {}}}}
spec: {slices: {count: 2}, training: {steps: 10, globalBatchSize: 4}, checkpoint: {uri: /tmp/ckpt}}
status: {phase: Running, step: 4}
""")
    job = load_manifest(path)
    assert job.metadata.namespace == "team-a" and job.metadata.labels == {"team": "ml"}
    assert job.metadata.generation == 3 and job.metadata.finalizers == ["elasticjax.dev/operator"]


@pytest.mark.parametrize("uri, expected", [
    ("s3://bucket/ckpt", "spec.checkpoint.uri: 's3://bucket/ckpt': unsupported scheme (use a local path or gs://bucket/prefix)"),
    ("file:///data/ckpt", "spec.checkpoint.uri: 'file:///data/ckpt': file:// is not supported; write the local path itself ('/data/ckpt')"),
    ("gs://", "spec.checkpoint.uri: 'gs://': no bucket name (use gs://bucket/prefix)"),
])
def test_checkpoint_uri_schemes_other_than_gs_are_refused(uri, expected):
    with pytest.raises(ManifestError) as e:
        parse_manifest(_job(checkpoint={"uri": uri}))
    assert str(e.value) == f"manifest: {expected}"
    for fine in ("gs://bucket", "gs://bucket/a/b", "/abs/path", "relative/path", "~/ckpt"):
        assert parse_manifest(_job(checkpoint={"uri": fine})).spec.checkpoint.uri == fine


@pytest.mark.parametrize(("override", "expected"), [
    # The runtime contract (elastic_jax/api/runtime_env.py): the operator's variables are not the user's.
    ({"controller": {"env": [{"name": contract.ENV_HOST, "value": "0.0.0.0"}]}},
     "spec.controller.env[0].name: ELASTIC_JAX_HOST is set by elastic-jax itself"),
    ({"worker": {"env": [{"name": "A", "value": "1"}, {"name": contract.ENV_TOKEN_FILE, "value": "/x"}]}},
     "spec.worker.env[1].name: ELASTIC_JAX_TOKEN_FILE is set by elastic-jax itself"),
    ({"controller": {"env": [{"name": "HOME", "value": "/root"}]}},
     "spec.controller.env[0].name: HOME is set by the operator in the cpu controller container"),
    ({"worker": {"env": [{"name": "JAX_PLATFORMS", "value": "tpu"}]}},
     "spec.worker.env[0].name: JAX_PLATFORMS is set by the operator in the cpu worker container"),
    ({"backend": "pathways", "slices": {"count": 2, "accelerator": "tpu-v5-lite-podslice", "topology": "2x2"},
      "controller": {"env": [{"name": "JAX_PLATFORMS", "value": "cpu"}]}},
     "spec.controller.env[0].name: JAX_PLATFORMS is set by the operator in the pathways controller container"),
    ({"backend": "pathways", "slices": {"count": 2, "accelerator": "tpu-v5-lite-podslice", "topology": "2x2"},
      "worker": {"env": [{"name": "MEGASCALE_SLICE_ID", "value": "0"}]}},
     "spec.worker.env[0].name: MEGASCALE_SLICE_ID is set by the operator in the pathways worker container"),
    ({"controller": {"env": [{"name": "A"}, {"name": "A", "value": "2"}]}},
     "spec.controller.env[1].name: A is set twice"),
    # Names and selectors as the API server checks them.
    ({"imagePullSecrets": [{"name": "Reg_Cred"}]}, "spec.imagePullSecrets[0]: secret name 'Reg_Cred' must be a Kubernetes object name"),
    ({"imagePullSecrets": ["regcred"]}, "spec.imagePullSecrets[0]: Input should be an object"),
    ({"priorityClassName": "High"}, "spec.priorityClassName 'High' must be a Kubernetes object name"),
    ({"worker": {"nodeSelector": {"pool name": "a"}}}, "spec.worker.nodeSelector key 'pool name' is not a valid label key"),
    ({"controller": {"nodeSelector": {"pool": "a b"}}}, "spec.controller.nodeSelector['pool'] value 'a b' is not a valid label value"),
    ({"worker": {"tolerations": [{"value": "x"}]}}, "spec.worker.tolerations[0]: a toleration without a key must have operator Exists"),
    ({"worker": {"tolerations": [{"key": "k", "operator": "Exists", "value": "v"}]}},
     "spec.worker.tolerations[0]: a toleration with operator Exists must not have a value"),
    ({"controller": {"tolerations": [{"key": "k", "effect": "NoSchedule", "tolerationSeconds": 5}]}},
     "spec.controller.tolerations[0]: tolerationSeconds needs effect NoExecute"),
    ({"worker": {"tolerations": [{"key": "k", "effect": "Never"}]}}, "spec.worker.tolerations[0].effect: Input should be"),
    ({"controller": {"serviceAccountName": "Trainer"}}, "spec.controller.serviceAccountName 'Trainer' must be a Kubernetes object name"),
    ({"controller": {"automountServiceAccountToken": True}},
     "spec.controller.automountServiceAccountToken needs spec.controller.serviceAccountName"),
])
def test_new_pod_fields_are_refused_naming_the_field(override, expected):
    with pytest.raises(ManifestError) as info:
        parse_manifest(_job(**override), "job.yaml")
    assert expected in str(info.value) and "\n" not in str(info.value)


def test_user_settings_of_the_runtime_stay_open():
    job = parse_manifest(_job(controller={"env": [{"name": contract.ENV_MAX_MESSAGE_BYTES, "value": "1000"},
                                                  {"name": contract.ENV_LOG_FORMAT, "value": "text"}]},
                              worker={"env": [{"name": contract.ENV_ALLOWED_CUSTOM_CALLS, "value": "lapack_sgetrf_ffi"},
                                              {"name": "XLA_FLAGS", "value": "--xla_cpu_use_thunk_runtime=false"}]}))
    assert [e.name for e in job.spec.worker.env] == [contract.ENV_ALLOWED_CUSTOM_CALLS, "XLA_FLAGS"]


@pytest.mark.parametrize("name", ["1=A", "A=", "TAB\tNAME", "é"])
def test_an_env_name_the_api_server_refuses_is_refused_naming_the_field(name):
    """Trial (kind): an env name with '=' passed validate and the CRD, then every controller pod create got 422
    while the worker pods ran."""
    with pytest.raises(ManifestError, match=r"spec\.controller\.env\[0\]\.name: .*printable ASCII characters other than '='"):
        parse_manifest(_job(controller={"env": [{"name": name, "value": "x"}]}), "job.yaml")


def test_env_names_kubernetes_takes_are_accepted():
    job = parse_manifest(_job(worker={"env": [{"name": "my.setting-1", "value": "x"}, {"name": "A B", "value": ""}]}))
    assert [e.name for e in job.spec.worker.env] == ["my.setting-1", "A B"]


@pytest.mark.parametrize("spec, expected", [
    # (a field error in the section, then the rules that field's error hid)
    ({"checkpoint": {"uri": "file:///tmp/x", "intervalSteps": 0}},
     ["spec.checkpoint.intervalSteps: Input should be greater than or equal to 1",
      "spec.checkpoint.uri: 'file:///tmp/x': file:// is not supported"]),
    ({"slices": {"count": 2, "minSlices": 3, "devicesPerHost": 0}},
     ["spec.slices.devicesPerHost: Input should be greater than or equal to 1",
      "spec.slices.minSlices (3) must not exceed spec.slices.count (2)"]),
    ({"controller": {"image": " x ", "automountServiceAccountToken": True, "args": ["a"],
                     "resources": {"requests": {"cpu": "lots"}}}},
     ["spec.controller.resources.requests.cpu: 'lots' is not a non-negative Kubernetes quantity",
      "spec.controller.args: needs spec.controller.command",
      "spec.controller.automountServiceAccountToken needs spec.controller.serviceAccountName"]),
    ({"compilationCache": {"uri": "/local", "persistentVolumeClaim": {"claimName": "Bad_Name"}}},
     ["spec.compilationCache.persistentVolumeClaim.claimName", "spec.compilationCache needs exactly one of",
      "spec.compilationCache.uri: '/local': must be gs://", "spec.compilationCache.uri: backend cpu reads"]),
    ({"elasticity": {"maxRestarts": -1, "progressTimeoutSeconds": 5}},
     ["spec.elasticity.maxRestarts: Input should be greater than or equal to 0",
      "spec.elasticity.progressTimeoutSeconds (5) must be 0 (off) or more than the longest step deadline"]),
])
def test_a_field_error_hides_no_other_rule_of_its_section(spec, expected):
    """A new-user trial: pydantic runs a section's rules only once all its fields validated, so one bad field
    hid the section's other rules; the API server runs each CEL rule beside the field errors."""
    with pytest.raises(ManifestError) as info:
        parse_manifest(_job(**spec), "job.yaml")
    problems = info.value.problems
    for fragment in expected:
        assert sum(fragment in p for p in problems) == 1, (fragment, problems)
    assert len(problems) == len(expected), problems
    assert all(p.startswith("job.yaml: ") and "\n" not in p for p in problems)


def test_a_rule_over_a_field_that_failed_is_skipped():
    """`minSlices` and `spares` are compared with `count`; a `count` that failed says so alone (no line saying
    `minSlices (1) must not exceed spec.slices.count (0)`), and the spec's rules over it are skipped too."""
    with pytest.raises(ManifestError) as info:
        parse_manifest(_job(slices={"count": "two", "minSlices": 1, "spares": 8},
                            training={"steps": 10, "globalBatchSize": 1}), "job.yaml")
    assert info.value.problems == ["job.yaml: spec.slices.count: 'two': must be an integer (a whole number, e.g. 10), "
                                   "not a string"]  # ('two' unquoted is still a string: no hint to unquote it)


def _bounded_int_fields(model, path=()):
    """(camelCase path, bound) of every int field of `model` and its nested sections that has an upper bound."""
    import types
    import typing

    from pydantic import BaseModel

    for name, field in model.model_fields.items():
        key = path + (field.alias or name,)
        union = typing.get_origin(field.annotation) in (typing.Union, types.UnionType)
        args = [a for a in typing.get_args(field.annotation) if a is not type(None)] if union else [field.annotation]
        items = [i for a in args if typing.get_origin(a) is list for i in typing.get_args(a)]
        section = next((a for a in args + items if isinstance(a, type) and issubclass(a, BaseModel)), None)
        if section is not None:
            yield from _bounded_int_fields(section, key + ((0,) if section in items else ()))
        elif int in args and any(getattr(m, "le", None) is not None for m in field.metadata):
            yield key


def _dotted(field: tuple) -> str:
    """`spec.worker.tolerations[0].tolerationSeconds`: a field path as an error line names it."""
    return located(field, "m").removesuffix(": m")


BOUNDED_INT_FIELDS = sorted(_bounded_int_fields(__import__("elastic_jax.api.job", fromlist=["x"]).ElasticTrainingJob))


@pytest.mark.parametrize("written", ["1e30", "100000000000000000000000", "123456789012345678901234567890"])
@pytest.mark.parametrize("field", BOUNDED_INT_FIELDS, ids=lambda f: _dotted(f))
def test_an_int_over_its_bound_is_shown_as_written_naming_the_field(tmp_path, field, written):
    """Trial finding: `steps: 1e30` read `(got 1000000000000000019884624838656)`, and an integer written out
    beyond 2**64 came back rounded through a float (YAML reads both as floats, as kubectl does). Every
    bounded int field of the manifest shows the value as written."""
    import yaml

    m = _job()
    node = m
    for key, after in zip(field, field[1:]):
        if isinstance(node, list):
            node.append({})
            node = node[key]
        else:
            node = node.setdefault(key, [] if isinstance(after, int) else {})
    node[field[-1]] = "__BIG__"
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(m).replace("__BIG__", written))
    with pytest.raises(ManifestError) as e:
        load_manifest(path)
    mine = [p for p in e.value.problems if f": {_dotted(field)}: " in p]
    assert len(mine) == 1 and mine[0].endswith(f"(got {written})"), e.value.problems
    assert len(BOUNDED_INT_FIELDS) > 10  # (the walk found the manifest's int fields)
