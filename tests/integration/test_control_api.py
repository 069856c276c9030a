"""The control API over real HTTP: auth, validation, idempotence, metrics."""

import httpx
import pytest

from elastic_jax.api.client import ControlApiError, ControlClient
from elastic_jax.api.control import ControllerStatus
from elastic_jax.controller.control_api import ControlApiServer, create_app
from elastic_jax.controller.elastic.slice_set import SliceSet
from elastic_jax.controller.metrics import ControllerMetrics

TOKEN = "s3cret-token"


@pytest.fixture
def api():
    slice_set = SliceSet(3)
    metrics = ControllerMetrics()
    status = lambda: ControllerStatus(  # noqa: E731
        phase="Running", step=7, total_steps=10, desired_slices=3, min_slices=2, active_slices=[0, 1],
        inactive_slices=[2], slices=slice_set.statuses(), pid=1,
    )
    server = ControlApiServer(create_app(slice_set, status, metrics, TOKEN, ready=lambda: True), port=0)
    server.start()
    base = f"http://127.0.0.1:{server.port}"
    try:
        yield base, slice_set, metrics
    finally:
        server.stop()


def snapshot(slice_set):
    return [(s.state, s.generation, tuple(s.addresses)) for s in slice_set.statuses()]


def test_unauthenticated_requests_get_401_and_change_nothing(api):
    base, slice_set, _ = api
    before = snapshot(slice_set)
    body = {"state": "Ready", "generation": 1, "addresses": ["127.0.0.1:9"]}
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN}):
        r = httpx.put(f"{base}/v1/slices/0", json=body, headers=headers)
        assert r.status_code == 401
        assert httpx.get(f"{base}/v1/status", headers=headers).status_code == 401
    # Even a malformed body gets 401 first: no information without the token.
    assert httpx.put(f"{base}/v1/slices/0", content=b"{not json", headers={}).status_code == 401
    assert snapshot(slice_set) == before


def test_bad_body_and_out_of_range_change_nothing(api):
    base, slice_set, _ = api
    auth = {"Authorization": f"Bearer {TOKEN}"}
    before = snapshot(slice_set)
    bad_bodies = [
        {"state": "Exploded", "generation": 1},
        {"state": "Ready", "generation": -1, "addresses": ["a:1"]},
        {"state": "Ready", "generation": 1},  # Ready needs addresses
        {"state": "Ready", "generation": 1, "addresses": ["a:1"], "extra": True},
        {"state": "Ready", "generation": 2**70, "addresses": ["a:1"]},  # beyond int64: would lock the slice out
        {"state": "Ready", "generation": 1, "addresses": ["bogus"]},  # not host:port
    ]
    for body in bad_bodies:
        assert httpx.put(f"{base}/v1/slices/0", json=body, headers=auth).status_code == 422, body
    assert httpx.put(f"{base}/v1/slices/0", content=b"{nope", headers=auth).status_code == 422
    r = httpx.put(f"{base}/v1/slices/3", json={"state": "Down", "generation": 1}, headers=auth)
    assert r.status_code == 404 and "out of range" in r.json()["detail"]
    assert httpx.put(f"{base}/v1/slices/x", json={"state": "Down", "generation": 1}, headers=auth).status_code == 422
    assert snapshot(slice_set) == before


def test_reports_are_idempotent_by_generation(api):
    base, slice_set, _ = api
    client = ControlClient(base, TOKEN)
    try:
        r = client.report_slice(1, "Ready", 5, ["127.0.0.1:7001"])
        assert r.applied and r.generation == 5
        again = client.report_slice(1, "Ready", 5, ["127.0.0.1:7001"])
        assert not again.applied
        stale = client.report_slice(1, "Down", 4)
        assert not stale.applied and slice_set.record(1).state == "Ready"
        assert client.report_slice(1, "Down", 6, reason="exit 137").applied
        assert slice_set.record(1).state == "Down"
        status = client.status()
        assert status.step == 7 and status.slices[1].state == "Down"
    finally:
        client.close()


def test_client_raises_on_rejection_and_unreachable(api):
    base, _, _ = api
    bad = ControlClient(base, "wrong")
    with pytest.raises(ControlApiError) as info:
        bad.report_slice(0, "Down", 1)
    assert info.value.status_code == 401
    bad.close()
    gone = ControlClient("http://127.0.0.1:9", TOKEN, timeout_s=0.2)
    with pytest.raises(ControlApiError, match="unreachable after 2 tries"):
        gone.report_slice(0, "Down", 1, retries=1, backoff_s=0.01)
    gone.close()


def test_health_ready_and_metrics_are_open(api):
    base, _, metrics = api
    metrics.recoveries.labels(cause="slice_down").inc()
    assert httpx.get(f"{base}/healthz").text == "ok"
    assert httpx.get(f"{base}/readyz").status_code == 200
    text = httpx.get(f"{base}/metrics").text
    assert 'elastic_jax_recoveries_total{cause="slice_down"} 1.0' in text
    assert "elastic_jax_goodput_ratio" in text
