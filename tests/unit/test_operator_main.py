"""`elastic-jax-operator`'s command line: bad settings are usage errors naming the flag, never tracebacks."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import kopf
import pytest

from elastic_jax import contract
from elastic_jax.k8s_operator import main as operator_main
from tests.support.silent_server import SilentServer

EXE = shutil.which("elastic-jax-operator", path=str(Path(sys.executable).parent))


@pytest.mark.parametrize("env, flag", [
    # Kubernetes injects ELASTIC_JAX_METRICS_PORT=tcp://IP:PORT for a Service named elastic-jax-metrics
    # in a pod without enableServiceLinks: false (seen on kind).
    ({contract.ENV_METRICS_PORT: "tcp://10.96.0.10:9090"}, "--metrics-port"),
    ({contract.ENV_METRICS_PORT: "70000"}, "--metrics-port"),
    ({contract.ENV_NODE_LOST_SECONDS: "-1"}, "--node-lost-seconds"),
    # A literal $(POD_IP) would have been expanded by the kubelet in the operator's own pod: words only.
    ({contract.ENV_POD_LISTEN_ADDRESS: "$(POD_IP)"}, "--pod-listen-address"),
    # `choices` would not check an env default: the operator fell back to plain logs silently.
    ({contract.ENV_LOG_FORMAT: "yaml"}, "--log-format"),
    ({contract.ENV_STOP_DEADLINE_SECONDS: "0"}, "--stop-deadline-seconds"),
    ({contract.ENV_STOP_DEADLINE_SECONDS: "inf"}, "--stop-deadline-seconds"),
    ({contract.ENV_NODE_LOST_SECONDS: "nan"}, "--node-lost-seconds"),
])
def test_bad_environment_setting_is_a_usage_error_naming_the_flag(env, flag, monkeypatch, capsys):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert f"argument {flag}:" in _usage_error(monkeypatch, capsys, operator_main.main, [])


def _usage_error(monkeypatch, capsys, main, argv: list[str]) -> str:
    """`main(argv)` in this process, which must stop at its argument parser with exit 2 (argparse's usage
    error); its stderr. Parsing is all it may do here: past it, kopf would be configured (then a failure,
    not an operator run)."""
    monkeypatch.setattr(kopf, "configure", _parsed)
    with pytest.raises(SystemExit) as stopped:
        main(argv)
    assert stopped.value.code == 2
    return capsys.readouterr().err


def _parsed(*_, **__):
    raise AssertionError("the arguments were accepted")


def test_the_policy_flags_become_the_operators_one_admin_policies_value(monkeypatch):
    """main builds one `AdminPolicies` from the flags (no module global), which the `OperatorState` holds."""
    from elastic_jax.k8s_operator.admin_policies import AdminPolicies

    built: list[AdminPolicies] = []
    parse = operator_main._admin_policies
    monkeypatch.setattr(operator_main, "_admin_policies", lambda parser, args: built.append(parse(parser, args))
                        or built[-1])
    monkeypatch.setattr(kopf, "configure", _parsed)  # (stop right after the flags: nothing of kopf runs)
    with pytest.raises(AssertionError, match="accepted"):
        operator_main.main(["--metrics-port", "0", "--denied-namespaces", "ops", "--allowed-service-accounts",
                            "ml/trainer", "--allowed-priority-classes", "low", "--checkpoint-prefixes",
                            "gs://ck/{namespace}/", "--allowed-image-pull-secrets", "ml/*"])
    (policies,) = built
    assert policies.denied_namespaces.names == {"ops"}
    assert policies.service_accounts.allowed == {("ml", "trainer")}
    assert policies.pod_fields.priority_classes == {"low"} and policies.pod_fields.pull_secrets == {("ml", "*")}
    assert policies.checkpoint_prefixes.templates == ("gs://ck/{namespace}/",)
    assert AdminPolicies() != policies  # (and the defaults stay the defaults: nothing was set globally)


def test_the_operators_usage_error_is_exit_2_without_a_traceback_from_its_console_script():
    """The one real process of the usage errors above (in-process, from `main`): the installed command."""
    env = {**os.environ, contract.ENV_NODE_LOST_SECONDS: "nan"}
    proc = subprocess.run([EXE], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert "argument --node-lost-seconds:" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


@pytest.mark.parametrize("flag", ["--metrics-port", "--liveness"])
def test_a_port_in_use_is_one_error_line_naming_the_flag_and_port(flag):
    """The metrics port printed an OSError traceback; kopf's liveness port failed inside `kopf.run`."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        args = (["--metrics-port", str(port), "--metrics-host", "127.0.0.1"] if flag == "--metrics-port" else
                ["--metrics-port", "0", "--liveness", f"http://127.0.0.1:{port}/healthz"])
        env = {k: v for k, v in os.environ.items() if not k.startswith("KUBERNETES_")}
        env["KUBECONFIG"] = os.devnull  # (it must stop before reaching any cluster)
        proc = subprocess.run([EXE, *args], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("error: ")]
    assert len(errors) == 1 and errors[0].startswith(f"error: {flag} ") and str(port) in errors[0], proc.stderr
    assert "in use" in errors[0] and "Traceback" not in proc.stderr, proc.stderr


@pytest.mark.parametrize("value", ["0", "-2", "eight"])
def test_a_bad_thread_count_is_a_usage_error_naming_the_flag(value, monkeypatch, capsys):
    """`--workers 0` reached the reconcile pass pool: a ValueError traceback from ThreadPoolExecutor."""
    err = _usage_error(monkeypatch, capsys, operator_main.main, ["--metrics-port", "0", "--workers", value])
    assert "argument --workers:" in err and "Traceback" not in err, err


def test_every_image_takes_the_same_log_formats(monkeypatch, capsys):
    """One list (`elastic_jax.logs.FORMATS`): the controller took json|text, the operator json|plain, and the
    worker had no --log-format at all (JSON whatever ELASTIC_JAX_LOG_FORMAT said). Each image's `main`
    (the worker's argument parser), in this process: `--help` and a usage error stop at the parser."""
    from elastic_jax.controller import main as controller_main
    from elastic_jax.worker import main as worker_main

    for main in (operator_main.main, controller_main.main, worker_main.parse_args):
        with pytest.raises(SystemExit) as helped:
            main(["--help"])
        out = capsys.readouterr().out
        assert helped.value.code == 0 and "json or text" in out, (main, out)
        err = _usage_error(monkeypatch, capsys, main, ["--log-format", "xml"])
        assert "argument --log-format: 'xml': must be one of json, text" in err, (main, err)


@pytest.mark.slow  # (a fresh interpreter importing the operator: ~15 s at load 10)
def test_the_api_client_classes_are_imported_with_the_handlers_not_in_the_first_reconcile_pass():
    # kubernetes.client imports an API class (and its model modules) on first use: in the first pass that
    # took 5-7 s on a loaded machine, and a SIGTERM during it waited for it (e2e/test_operator_sigterm.py).
    code = ("import sys; import elastic_jax.k8s_operator.handlers; "
            "print(sorted(m for m in ('kubernetes.client.api.core_v1_api', 'kubernetes.client.api.batch_v1_api', "
            "'kubernetes.client.api.custom_objects_api') if m not in sys.modules))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]", f"imported only in the first pass: {proc.stdout}"


def test_the_diff_base_is_a_small_marker_whatever_the_spec_size():
    """kopf sees a job as new until creation was handled, then as unchanged for good (no handler reacts
    to updates), and stores a few bytes, not the spec: a 300 KB spec used to overflow the annotations."""
    import kopf

    from elastic_jax.k8s_operator.main import HandledMarkerDiffBase

    storage = HandledMarkerDiffBase(prefix="elasticjax.dev", key="last-handled-configuration")
    raw = {"apiVersion": "elasticjax.dev/v1alpha1", "kind": "ElasticTrainingJob",
           "metadata": {"name": "j", "annotations": {}}, "spec": {"big": "x" * 300_000}}
    assert storage.fetch(body=kopf.Body(raw)) is None  # kopf: the create cause
    patch = kopf.Patch()
    storage.store(body=kopf.Body(raw), patch=patch, essence=storage.build(body=kopf.Body(raw)))
    written = dict(patch["metadata"]["annotations"])
    assert sum(len(k) + len(v) for k, v in written.items()) < 200, written
    raw["metadata"]["annotations"].update(written)
    raw["spec"]["big"] = "changed"
    body = kopf.Body(raw)
    assert storage.fetch(body=body) == storage.build(body=body)  # no diff: no update cause, no more patches
    again = kopf.Patch()
    storage.store(body=body, patch=again, essence=storage.build(body=body))
    assert not again, dict(again)


STARTED = "Activity 'main.<locals>._startup' succeeded."  # kopf's log line: its signal handlers are installed


@pytest.mark.slow  # (a real operator process's start and stop: ~20 s at load 10)
def test_a_stop_that_hangs_on_the_api_server_ends_by_itself_at_the_deadline_with_exit_0(tmp_path):
    """kopf's own stop can outlast a pod's grace (CI saw a SIGTERM during its discovery of the cluster's
    resources hang past 10 s). Here the real `elastic-jax-operator` discovers against a server that never
    answers and gets SIGTERM: the deadline (armed by the cleanup activity kopf runs when it starts to
    stop) ends the process with exit 0 and its one stderr line. The deadline is 1 s here because kopf
    itself cancels the discovery 5 s into its stop, which the default 6 s would not reach."""
    server = SilentServer()
    env = {k: v for k, v in os.environ.items() if not k.startswith("KUBERNETES_")}
    env["KUBECONFIG"] = str(server.kubeconfig(tmp_path))
    err_path = tmp_path / "stderr"
    proc = None
    try:
        with open(err_path, "w") as err:
            proc = subprocess.Popen([EXE, "--metrics-port", "0", "--log-format", "text", "--stop-deadline-seconds",
                                     "1"], env=env, stdout=subprocess.DEVNULL, stderr=err)
        # kopf's signal handlers are in place (its startup activity ran) and its discovery waits on the server
        for _ in range(1200):
            if (server.accepted and STARTED in err_path.read_text()) or proc.poll() is not None:
                break
            time.sleep(0.1)
        assert proc.poll() is None and server.accepted, err_path.read_text()
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=120)  # (no timing asserted: it must end by itself, not when killed)
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
        server.stop()
    stderr = err_path.read_text()
    assert code == 0, stderr
    assert "Signal SIGTERM is received" in stderr, stderr
    assert "kopf did not finish stopping within 1 s of SIGTERM: exiting" in stderr.splitlines(), stderr



def test_auto_peering_priority_makes_the_newest_operator_active_and_no_two_equal():
    """Issue 31 item 14 (kopf#247): two replicas at the chart's one fixed priority froze each other (kopf
    freezes operators of equal priority) and a job stayed Pending with no Event. `auto` (the chart's default)
    gives each process its start time: the newer pod of an upgrade or a scale-up wins, the older pauses."""
    from elastic_jax.k8s_operator.main import _priority, peering_priority

    assert _priority("auto") == "auto" and _priority("7") == 7
    assert peering_priority(7) == 7
    old, new = peering_priority("auto", now_s=1_800_000_000.0), peering_priority("auto", now_s=1_800_000_001.0)
    assert new > old and new < 2**53
    same_ms = {peering_priority("auto", now_s=1_800_000_000.0, tie_breaker=t) for t in (0, 1)}
    assert len(same_ms) == 2  # the same millisecond: still not equal
    assert len({peering_priority("auto") for _ in range(50)}) > 1
