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


def test_probes_are_public_metrics_need_the_token_and_there_is_no_openapi(api):
    base, _, metrics = api
    metrics.recoveries.labels(cause="slice_down").inc()
    assert httpx.get(f"{base}/healthz").text == "ok"
    assert httpx.get(f"{base}/readyz").status_code == 200
    for path in ("/metrics", "/openapi.json", "/docs", "/redoc", "/nothing"):
        r = httpx.get(f"{base}{path}")
        assert r.status_code == 401, path
        assert "elastic_jax" not in r.text and "openapi" not in r.text
    auth = {"Authorization": f"Bearer {TOKEN}"}
    assert httpx.get(f"{base}/openapi.json", headers=auth).status_code == 404
    text = httpx.get(f"{base}/metrics", headers=auth).text
    assert 'elastic_jax_recoveries_total{cause="slice_down"} 1.0' in text
    assert "elastic_jax_goodput_ratio" in text


AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.mark.parametrize("generation", [True, "3", 3.0, None, [3], 2**63])
def test_generation_must_be_a_strict_integer(api, generation):
    base, slice_set, _ = api
    before = snapshot(slice_set)
    r = httpx.put(f"{base}/v1/slices/0", json={"state": "Down", "generation": generation}, headers=AUTH)
    assert r.status_code == 422
    assert snapshot(slice_set) == before


def test_a_generation_far_ahead_cannot_lock_a_slice_out(api):
    import time

    from elastic_jax.api.control import MAX_GENERATION_AHEAD_S

    base, slice_set, _ = api
    client = ControlClient(base, TOKEN)
    try:
        for far in (2**63 - 1, time.time_ns() + (MAX_GENERATION_AHEAD_S + 60) * 10**9):
            with pytest.raises(ControlApiError, match="ahead of this controller's clock") as e:
                client.report_slice(0, "Down", far)
            assert e.value.status_code == 422
        # The lock-out that did happen (issue 9, item 17): the launcher's next
        # report, a timestamp, must still be applied.
        assert client.report_slice(0, "Ready", time.time_ns(), ["127.0.0.1:7001"]).applied
        assert slice_set.record(0).state == "Ready"
        # Within the allowed skew it is applied (the sender's clock may be a little ahead).
        assert client.report_slice(0, "Down", time.time_ns() + 10**9).applied
    finally:
        client.close()


def test_oversized_bodies_get_413_and_errors_never_echo_the_body(api):
    from elastic_jax.controller.control_api import MAX_BODY_BYTES

    base, slice_set, _ = api
    before = snapshot(slice_set)
    marker = "ECHO-ME-" * 8
    huge = {"state": "Down", "generation": 1, "reason": marker + "x" * MAX_BODY_BYTES}
    r = httpx.put(f"{base}/v1/slices/0", json=huge, headers=AUTH)
    assert r.status_code == 413 and marker not in r.text and len(r.content) < 200

    def chunks():  # no Content-Length: the cap counts the bytes as they arrive
        yield b'{"state": "Down", "generation": 1, "reason": "'
        for _ in range(MAX_BODY_BYTES // 4096 + 2):
            yield b"y" * 4096
        yield b'"}'

    r = httpx.put(f"{base}/v1/slices/0", content=chunks(), headers={**AUTH, "Content-Type": "application/json"})
    assert r.status_code == 413
    # A 422 names the field without the value sent.
    r = httpx.put(f"{base}/v1/slices/0", json={"state": marker, "generation": 1}, headers=AUTH)
    assert r.status_code == 422 and marker not in r.text
    assert r.json()["detail"][0]["loc"] == ["body", "state"]
    r = httpx.put(f"{base}/v1/slices/0", content=("{" + marker).encode(), headers=AUTH)
    assert r.status_code == 422 and marker not in r.text
    assert snapshot(slice_set) == before


def test_the_largest_valid_report_fits_the_body_cap(api):
    import json

    from elastic_jax.controller.control_api import MAX_BODY_BYTES

    base, _, _ = api
    body = {"state": "Ready", "generation": 1, "addresses": [("h" * 294) + ":65535"] * 256, "reason": "r" * 1024}
    assert len(json.dumps(body)) < MAX_BODY_BYTES
    assert httpx.put(f"{base}/v1/slices/0", json=body, headers=AUTH).status_code == 200


@pytest.mark.parametrize("path", ["/v1/slices/0", "/v1/stop"])
@pytest.mark.parametrize("body, content_type, field", [
    (b'{"state": "Down", "generation": ' + b"9" * 5000 + b"}", "application/json", "generation"),  # int() refuses it
    (b'{"state": "Down", "generation": -' + b"9" * 5000 + b"}", "application/json", "generation"),
    (b'{"state": "Down", "generation": 1, "generation": 2}', "application/json", "generation"),  # which one wins?
    (b'{"state": "Down", "generation": 1, "reason": "\xff"}', "application/json", None),  # not UTF-8
    (b'{"state": "Down", "generation": 1, "reason": ' + b"[" * 5000 + b"]" * 5000 + b"}", "application/json", None),
    (b"", "application/json", None),
    (b'{"state": "Down", "generation": 1}', "text/plain", None),
    (b'{"state": "Down", "generation": 1}', None, None),
])
def test_every_invalid_body_is_422_naming_the_field(api, path, body, content_type, field):
    """A 5000-digit generation was a bare 400 ("There was an error parsing the body"), as were bodies that are
    not UTF-8 or nest too deeply: every invalid body is 422 with the field named where there is one."""
    base, slice_set, _ = api
    before = snapshot(slice_set)
    headers = {**AUTH, **({"Content-Type": content_type} if content_type else {})}
    r = httpx.request("PUT" if "slices" in path else "POST", base + path, content=body, headers=headers)
    assert r.status_code == 422, (r.status_code, r.text)
    locs = [d["loc"] for d in r.json()["detail"]]
    assert all(loc[0] == "body" for loc in locs), locs
    if field and "slices" in path:
        assert ["body", field] in locs, locs
    assert len(r.content) < 1000  # never echoes the body
    assert snapshot(slice_set) == before


def test_a_long_poll_answers_when_a_report_moves_the_version_and_waits_out_no_change(api):
    """`GET /v1/status?after=<version>&wait=<s>` (docs/control-api.md): the operator's status watch."""
    import threading

    base, slice_set, _ = api
    client = ControlClient(base, TOKEN)
    try:
        first = client.status()
        assert first.version > 0
        unchanged = client.status(after=first.version, wait_s=0.2)  # nothing moved: the same version at its end
        assert unchanged.version == first.version
        assert client.status(after=first.version - 1, wait_s=30).version == first.version  # moved already: at once
        answers = []
        waiter = threading.Thread(target=lambda: answers.append(client.status(after=first.version, wait_s=30)))
        waiter.start()
        client.report_slice(2, "Ready", 9, ["127.0.0.1:7002"])
        waiter.join(60)
        # (a route that ignored `after` would have answered the old version, slice 2 not Ready)
        assert answers and answers[0].version > first.version and answers[0].slices[2].state == "Ready"
    finally:
        client.close()


@pytest.mark.parametrize("query, field", [
    ("after=1&wait=31", "wait"), ("after=1&wait=-1", "wait"), ("after=1&wait=nan", "wait"),
    ("after=1&wait=inf", "wait"), ("after=1&wait=x", "wait"), ("after=-5&wait=1", "after"),
    ("after=abc&wait=1", "after"), ("after=99999999999999999999999&wait=1", "after"),
])
def test_long_poll_parameters_out_of_bounds_are_422_naming_the_field(api, query, field):
    base, _, _ = api
    r = httpx.get(f"{base}/v1/status?{query}", headers=AUTH)
    assert r.status_code == 422, (r.status_code, r.text)
    assert ["query", field] in [d["loc"] for d in r.json()["detail"]]
    assert httpx.get(f"{base}/v1/status?after=1&wait=1").status_code == 401  # the token first, as on every route
