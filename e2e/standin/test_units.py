"""Pure parts of the harness and node agent: image table, env expansion, layout, ports, bad input."""

from __future__ import annotations

import pytest

from e2e.harness import layout
from e2e.harness.ports import Ports
from e2e.nodeagent import envvars, images
from e2e.nodeagent.agent import PodIPs


def test_image_table_resolves_project_and_generic_images():
    assert images.resolve("ghcr.io/elastic-jax/controller:0.1.0").entrypoint == ("elastic-jax-controller",)
    assert images.resolve("ghcr.io/elastic-jax/worker:0.1.0").entrypoint == ("elastic-jax-worker",)
    assert images.resolve("docker.io/library/python:3.11-slim").cmd == ("python3",)
    assert images.resolve("busybox").cmd == ("sh",)


@pytest.mark.parametrize("ref", ["ghcr.io/elastic-jax/worker:9.9.9", "nginx", "ghcr.io/other/controller:0.1.0"])
def test_unknown_image_names_the_table(ref):
    with pytest.raises(images.UnknownImage, match="e2e/nodeagent/images.py"):
        images.resolve(ref)


def test_command_replaces_entrypoint_and_args_replace_cmd():
    worker = images.resolve("ghcr.io/elastic-jax/worker:0.1.0")
    assert images.argv(worker, None, ["--slice", "1"]) == ["elastic-jax-worker", "--slice", "1"]
    assert images.argv(worker, ["python"], None) == ["python"]
    assert images.argv(images.resolve("python"), None, None) == ["python3"]
    with pytest.raises(ValueError, match="no command"):
        images.argv(images.Image(), None, None)


def test_env_expansion_follows_kubernetes_rules():
    env = {"A": "x"}
    assert envvars.expand("$(A)-$(B)-$$(A)-$$", env) == "x-$(B)-$(A)-$"


def test_downward_api_field_paths():
    pod = {"metadata": {"name": "p", "namespace": "n", "uid": "u", "labels": {"slice": "2"}},
           "spec": {"nodeName": "tpu-pool-a-0"}, "status": {"podIP": "127.0.12.2"}}
    assert envvars.field_value(pod, "metadata.labels['slice']") == "2"
    assert envvars.field_value(pod, "status.podIP") == "127.0.12.2"
    with pytest.raises(envvars.EnvError, match="unsupported"):
        envvars.field_value(pod, "spec.nope")


def test_layout_gives_every_node_its_own_address_block():
    nodes = layout.nodes()
    assert len({n.host_ip for n in nodes}) == len(nodes) == 8
    pools = {n.pool for n in nodes}
    assert pools == {"cpu-pool", "tpu-pool-a", "tpu-pool-b", "tpu-pool-c"}
    assert {n.host_ip.split(".")[1] for n in layout.nodes(address_octet=164)} == {"164"}
    with pytest.raises(ValueError, match="0-255"):
        layout.nodes(address_octet=300)
    with pytest.raises(ValueError, match="no nodes"):
        layout.nodes((layout.PoolSpec("empty", 0, "e2-standard-8", "8", "32Gi"),))


def test_pod_ips_are_reused_after_release_and_bad_host_ip_is_refused():
    ips = PodIPs("127.0.10.1")
    a, b = ips.allocate(), ips.allocate()
    assert (a, b) == ("127.0.10.2", "127.0.10.3")
    ips.release(a)
    assert ips.allocate() == a
    with pytest.raises(ValueError, match="127.X.Y.1"):
        PodIPs("10.0.0.1")


def test_port_base_sets_the_address_block():
    assert Ports.from_base(16400).address_octet == 164
    assert Ports.from_base(18400).address_octet != Ports.from_base(19400).address_octet


def test_port_base_out_of_range_is_refused():
    with pytest.raises(ValueError, match="E2E_PORT_BASE"):
        Ports.from_base(80)


def test_a_cluster_folder_remembers_its_port_base(tmp_path, monkeypatch):
    # `python -m e2e.harness status` without E2E_PORT_BASE must find a cluster started with one.
    from e2e.harness.cluster import LocalCluster
    (tmp_path / LocalCluster.PORT_BASE_FILE).write_text("17400")
    monkeypatch.delenv("E2E_PORT_BASE", raising=False)
    assert LocalCluster(state=tmp_path).ports.apiserver == 17400 + 43
    monkeypatch.setenv("E2E_PORT_BASE", "18400")
    assert LocalCluster(state=tmp_path).ports.apiserver == 18400 + 43
