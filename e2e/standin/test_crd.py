"""A CRD's openAPIV3Schema is enforced by the API server itself (422 with its own message)."""

from __future__ import annotations

import subprocess

import pytest

from e2e.nodeagent.kubeapi import ApiError

CRD = """
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: widgets.e2e.example.com}
spec:
  group: e2e.example.com
  scope: Namespaced
  names: {plural: widgets, singular: widget, kind: Widget}
  versions:
  - name: v1
    served: true
    storage: true
    schema:
      openAPIV3Schema:
        type: object
        required: [spec]
        properties:
          spec:
            type: object
            required: [slices]
            properties:
              slices: {type: integer, minimum: 1}
"""


@pytest.fixture(scope="module")
def widget_crd(cluster):
    cluster.kubectl("apply", "-f", "-", input=CRD)
    cluster.kubectl("wait", "--for=condition=Established", "crd/widgets.e2e.example.com", "--timeout=30s")
    yield
    cluster.kubectl("delete", "crd", "widgets.e2e.example.com", "--wait=false", check=False)


def test_invalid_object_is_rejected_with_422(cluster, namespace, widget_crd):
    api = cluster.api()
    base = f"/apis/e2e.example.com/v1/namespaces/{namespace}/widgets"
    with pytest.raises(ApiError) as err:
        api.create(base, {"apiVersion": "e2e.example.com/v1", "kind": "Widget",
                          "metadata": {"name": "bad"}, "spec": {"slices": 0}})
    assert err.value.status == 422
    assert err.value.body["reason"] == "Invalid"
    assert "spec.slices in body should be greater than or equal to 1" in err.value.body["message"]

    bad = "apiVersion: e2e.example.com/v1\nkind: Widget\nmetadata: {name: bad2}\nspec: {slices: many}\n"
    with pytest.raises(subprocess.CalledProcessError) as kerr:
        cluster.kubectl("apply", "-n", namespace, "-f", "-", input=bad)
    assert 'The Widget "bad2" is invalid' in kerr.value.stderr
    assert "spec.slices in body must be of type integer" in kerr.value.stderr

    ok = api.create(base, {"apiVersion": "e2e.example.com/v1", "kind": "Widget",
                           "metadata": {"name": "good"}, "spec": {"slices": 2}})
    assert ok["spec"]["slices"] == 2
