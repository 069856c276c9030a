"""What the node agent promises a pod: files, env, in-cluster API access, status, restarts, deletion, deadlines."""

from __future__ import annotations

import json
import os
import time
from datetime import datetime, timezone

from e2e.helpers import apply, is_ready, pod, summary, wait_for

IN_CLUSTER = """
apiVersion: v1
kind: Secret
metadata: {name: api-token}
stringData: {token: s3cret}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: settings}
data: {mode: fast}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: pod-reader}
rules:
- {apiGroups: [""], resources: [pods], verbs: [get, list]}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: pod-reader}
subjects: [{kind: ServiceAccount, name: default}]
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: pod-reader}
---
apiVersion: v1
kind: Pod
metadata:
  name: probe
  labels: {slice: "3"}
spec:
  restartPolicy: Never
  containers:
  - name: main
    image: python:3.11
    workingDir: /tmp
    command: ["python", "-c"]
    args:
    - |
      import json, os, pathlib
      from kubernetes import client, config
      sa = pathlib.Path("/var/run/secrets/kubernetes.io/serviceaccount")
      config.load_incluster_config()
      me = client.CoreV1Api().read_namespaced_pod(os.environ["POD_NAME"], (sa / "namespace").read_text())
      print(json.dumps({
          "namespace": (sa / "namespace").read_text(),
          "has_token": len((sa / "token").read_text()) > 100,
          "ca": (sa / "ca.crt").read_text().startswith("-----BEGIN CERTIFICATE-----"),
          "secret": pathlib.Path("/etc/api-token/token").read_text(),
          "mode": pathlib.Path("/etc/settings/mode").read_text(),
          "slice": os.environ["SLICE"], "greeting": os.environ["GREETING"],
          "secret_env": os.environ["SECRET_ENV"], "cwd": os.getcwd(),
          "api_pod_ip": me.status.pod_ip, "env_pod_ip": os.environ["POD_IP"],
          "hostname": os.environ["HOSTNAME"],
      }))
    env:
    - {name: POD_NAME, valueFrom: {fieldRef: {fieldPath: metadata.name}}}
    - {name: POD_IP, valueFrom: {fieldRef: {fieldPath: status.podIP}}}
    - {name: SLICE, valueFrom: {fieldRef: {fieldPath: "metadata.labels['slice']"}}}
    - {name: SECRET_ENV, valueFrom: {secretKeyRef: {name: api-token, key: token}}}
    - {name: GREETING, value: "slice-$(SLICE)"}
    volumeMounts:
    - {name: token, mountPath: /etc/api-token, readOnly: true}
    - {name: settings, mountPath: /etc/settings}
  volumes:
  - {name: token, secret: {secretName: api-token}}
  - {name: settings, configMap: {name: settings}}
"""


def test_pod_sees_its_files_env_and_the_api_in_cluster(cluster, namespace):
    apply(cluster, IN_CLUSTER, namespace)
    done = wait_for(lambda: pod(cluster, namespace, "probe")["status"].get("phase") in ("Succeeded", "Failed"),
                    timeout_s=60, what="probe pod finishes")
    assert done
    p = pod(cluster, namespace, "probe")
    log = cluster.container_log(namespace, "probe", "main")
    assert p["status"]["phase"] == "Succeeded", log
    seen = json.loads(log.strip().splitlines()[-1])
    assert seen == {
        "namespace": namespace, "has_token": True, "ca": True, "secret": "s3cret", "mode": "fast",
        "slice": "3", "greeting": "slice-3", "secret_env": "s3cret", "cwd": "/tmp",
        "api_pod_ip": p["status"]["podIP"], "env_pod_ip": p["status"]["podIP"], "hostname": "probe",
    }
    term = p["status"]["containerStatuses"][0]["state"]["terminated"]
    assert term["exitCode"] == 0 and term["reason"] == "Completed"


RESTARTS = """
apiVersion: v1
kind: Pod
metadata: {name: flaky}
spec:
  restartPolicy: OnFailure
  containers:
  - name: main
    image: busybox
    command: ["sh", "-c", "n=$(cat /scratch/n 2>/dev/null || echo 0); echo $((n+1)) > /scratch/n; echo run $n; [ $n -ge 2 ]"]
    volumeMounts: [{name: scratch, mountPath: /scratch}]
  volumes: [{name: scratch, emptyDir: {}}]
"""


def test_on_failure_restarts_count_until_success(cluster, namespace):
    apply(cluster, RESTARTS, namespace)
    wait_for(lambda: pod(cluster, namespace, "flaky")["status"].get("phase") == "Succeeded", timeout_s=60,
             what="flaky pod succeeds", explain=lambda: summary([pod(cluster, namespace, "flaky")]))
    status = pod(cluster, namespace, "flaky")["status"]["containerStatuses"][0]
    assert status["restartCount"] == 2
    assert status["lastState"]["terminated"]["exitCode"] == 1
    assert status["state"]["terminated"]["exitCode"] == 0
    assert cluster.container_log(namespace, "flaky", "main").split() == ["run", "0", "run", "1", "run", "2"]


def test_never_policy_reports_exit_code(cluster, namespace):
    apply(cluster, """
apiVersion: v1
kind: Pod
metadata: {name: fails}
spec:
  restartPolicy: Never
  containers: [{name: main, image: busybox, command: ["sh", "-c", "exit 7"]}]
""", namespace)
    wait_for(lambda: pod(cluster, namespace, "fails")["status"].get("phase") == "Failed", timeout_s=30,
             what="pod fails")
    cs = pod(cluster, namespace, "fails")["status"]["containerStatuses"][0]
    assert cs["state"]["terminated"]["exitCode"] == 7 and cs["state"]["terminated"]["reason"] == "Error"
    assert cs["restartCount"] == 0


def test_unknown_image_fails_fast_with_err_image_pull(cluster, namespace):
    apply(cluster, """
apiVersion: v1
kind: Pod
metadata: {name: ghost}
spec:
  containers: [{name: main, image: "registry.example.com/nope:1.0"}]
""", namespace)
    wait_for(lambda: pod(cluster, namespace, "ghost")["status"].get("phase") == "Failed", timeout_s=20,
             what="pod with unknown image fails")
    p = pod(cluster, namespace, "ghost")
    assert p["status"]["reason"] == "ErrImagePull"
    waiting = p["status"]["containerStatuses"][0]["state"]["waiting"]
    assert waiting["reason"] == "ErrImagePull" and "registry.example.com/nope:1.0" in waiting["message"]


def test_readiness_probe_gates_ready(cluster, namespace):
    apply(cluster, """
apiVersion: v1
kind: Pod
metadata: {name: slow}
spec:
  containers:
  - name: main
    image: busybox
    command: ["sh", "-c", "sleep 3; touch /tmp/ready-$(POD_UID); sleep 300"]
    env: [{name: POD_UID, valueFrom: {fieldRef: {fieldPath: metadata.uid}}}]
    readinessProbe:
      exec: {command: ["sh", "-c", "test -f /tmp/ready-$POD_UID"]}
      periodSeconds: 1
""", namespace)
    wait_for(lambda: is_ready(pod(cluster, namespace, "slow")), timeout_s=30, what="pod becomes Ready")
    status = pod(cluster, namespace, "slow")["status"]
    started = _time(status["containerStatuses"][0]["state"]["running"]["startedAt"])
    ready_at = _time(next(c for c in status["conditions"] if c["type"] == "Ready")["lastTransitionTime"])
    # The file appears 3 s after start; timestamps have 1 s resolution.
    assert ready_at - started >= 2, (started, ready_at)


def _time(stamp: str) -> float:
    return datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc).timestamp()


def test_delete_sends_sigterm_then_sigkill_after_grace(cluster, namespace):
    apply(cluster, """
apiVersion: v1
kind: Pod
metadata: {name: polite}
spec:
  terminationGracePeriodSeconds: 30
  containers:
  - name: main
    image: python:3.11
    command: ["python", "-c", "import signal, time\\ndef bye(*_):\\n    print('got SIGTERM', flush=True); raise SystemExit(0)\\nsignal.signal(signal.SIGTERM, bye)\\nprint('up', flush=True)\\ntime.sleep(300)"]
---
apiVersion: v1
kind: Pod
metadata: {name: stubborn}
spec:
  terminationGracePeriodSeconds: 2
  containers:
  - name: main
    image: python:3.11
    command: ["python", "-c", "import signal, time\\nsignal.signal(signal.SIGTERM, lambda *_: print('ignoring SIGTERM', flush=True))\\nprint('up', flush=True)\\ntime.sleep(300)"]
""", namespace)
    for name in ("polite", "stubborn"):
        wait_for(lambda: "up" in _log(cluster, namespace, name), timeout_s=30, what=f"{name} up")
    started = time.monotonic()
    cluster.kubectl("delete", "pod", "polite", "stubborn", "-n", namespace, "--wait=true", timeout_s=60)
    elapsed = time.monotonic() - started
    assert "got SIGTERM" in _log(cluster, namespace, "polite")
    assert "ignoring SIGTERM" in _log(cluster, namespace, "stubborn")
    assert 2 <= elapsed < 15, f"stubborn pod should die by SIGKILL right after its 2 s grace, took {elapsed:.1f}s"


def _log(cluster, namespace, name):
    try:
        return cluster.container_log(namespace, name, "main")
    except FileNotFoundError:
        return ""


def test_active_deadline_fails_the_pod(cluster, namespace):
    apply(cluster, """
apiVersion: v1
kind: Pod
metadata: {name: late}
spec:
  activeDeadlineSeconds: 2
  terminationGracePeriodSeconds: 1
  containers: [{name: main, image: busybox, command: ["sleep", "300"]}]
""", namespace)
    wait_for(lambda: pod(cluster, namespace, "late")["status"].get("phase") == "Failed", timeout_s=30,
             what="pod fails at its deadline")
    assert pod(cluster, namespace, "late")["status"]["reason"] == "DeadlineExceeded"
    # As from a kubelet, the phase comes first and the killed container's end in a later status write (a
    # CI run under load read the status between the two: KeyError 'terminated').
    wait_for(lambda: "terminated" in pod(cluster, namespace, "late")["status"]["containerStatuses"][0]["state"],
             timeout_s=30, what="the killed container's terminated state")
    p = pod(cluster, namespace, "late")
    assert p["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 143


def test_init_containers_run_first_and_in_order(cluster, namespace):
    apply(cluster, """
apiVersion: v1
kind: Pod
metadata: {name: staged}
spec:
  restartPolicy: Never
  initContainers:
  - {name: one, image: busybox, command: ["sh", "-c", "echo one >> /work/steps"], volumeMounts: [{name: work, mountPath: /work}]}
  - {name: two, image: busybox, command: ["sh", "-c", "sleep 1; echo two >> /work/steps"], volumeMounts: [{name: work, mountPath: /work}]}
  containers:
  - {name: main, image: busybox, command: ["sh", "-c", "cat /work/steps"], volumeMounts: [{name: work, mountPath: /work}]}
  volumes: [{name: work, emptyDir: {}}]
""", namespace)
    wait_for(lambda: pod(cluster, namespace, "staged")["status"].get("phase") == "Succeeded", timeout_s=30,
             what="staged pod succeeds", explain=lambda: summary([pod(cluster, namespace, "staged")]))
    assert cluster.container_log(namespace, "staged", "main").split() == ["one", "two"]
    inits = pod(cluster, namespace, "staged")["status"]["initContainerStatuses"]
    assert [s["state"]["terminated"]["exitCode"] for s in inits] == [0, 0]


def test_failed_liveness_probe_restarts_the_container(cluster, namespace):
    apply(cluster, """
apiVersion: v1
kind: Pod
metadata: {name: wedged}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: main
    image: busybox
    command: ["sh", "-c", "echo start; exec sleep 300"]
    livenessProbe:
      exec: {command: ["false"]}
      periodSeconds: 1
      failureThreshold: 2
""", namespace)
    status = wait_for(lambda: [c for c in (pod(cluster, namespace, "wedged")["status"].get("containerStatuses") or [])
                               if c["restartCount"] >= 1 and "terminated" in c.get("lastState", {})],
                      timeout_s=30, what="container restarted by its liveness probe",
                      explain=lambda: summary([pod(cluster, namespace, "wedged")]))[0]
    assert status["lastState"]["terminated"]["exitCode"] == 143  # SIGTERM from the kill
    assert pod(cluster, namespace, "wedged")["status"]["phase"] == "Running"


def test_a_sidecar_holds_the_next_containers_until_its_startup_probe_passes(cluster, namespace):
    """As the kubelet: a restartable init container (native sidecar) with a startupProbe lets the next
    containers start only once the probe passed, and reports `started` then (the Pathways head's order)."""
    apply(cluster, """
apiVersion: v1
kind: Pod
metadata: {name: sidecar}
spec:
  restartPolicy: Never
  initContainers:
  - name: server
    image: python:3.11
    restartPolicy: Always
    command: ["python", "-c"]
    args:
    - |
      import os, socket, time
      while not os.path.exists(f"/tmp/e2e-go-{os.environ['POD_UID']}"):
          time.sleep(0.2)
      s = socket.create_server((socket.gethostbyname(os.environ["HOSTNAME"]), 29401))
      while True:
          s.accept()[0].close()
    env: [{name: POD_UID, valueFrom: {fieldRef: {fieldPath: metadata.uid}}}]
    startupProbe: {tcpSocket: {port: 29401}, periodSeconds: 1, failureThreshold: 600}
  containers:
  - {name: main, image: busybox, command: ["sh", "-c", "echo main started; sleep 300"]}
""", namespace)
    p = wait_for(lambda: (p := pod(cluster, namespace, "sidecar")) and "running" in
                 ((p["status"].get("initContainerStatuses") or [{}])[0].get("state") or {}) and p,
                 timeout_s=30, what="sidecar running")
    gate = f"/tmp/e2e-go-{p['metadata']['uid']}"
    try:
        p = pod(cluster, namespace, "sidecar")
        (server,), (main,) = p["status"]["initContainerStatuses"], p["status"]["containerStatuses"]
        assert not server["started"] and "running" not in main["state"], p["status"]
        open(gate, "w").close()
        wait_for(lambda: "main started" in _log_or_empty(cluster, namespace, "sidecar", "main"), timeout_s=30,
                 what="main container started after the startupProbe", explain=lambda: summary([pod(cluster, namespace, "sidecar")]))
        assert pod(cluster, namespace, "sidecar")["status"]["initContainerStatuses"][0]["started"] is True
    finally:
        if os.path.exists(gate):
            os.unlink(gate)


def _log_or_empty(cluster, namespace, name, container):
    try:
        return cluster.container_log(namespace, name, container)
    except FileNotFoundError:
        return ""


def test_a_headless_service_name_resolves_to_a_not_ready_pod_published_later(cluster, namespace):
    """CoreDNS's part for headless Services: a client started before its server resolves
    `<service>.<ns>.svc` once the Service selects the server (publishNotReadyAddresses: the
    server is never Ready), and connects to it."""
    apply(cluster, """
apiVersion: v1
kind: Pod
metadata: {name: client}
spec:
  restartPolicy: Never
  containers:
  - name: main
    image: python:3.11
    command: ["python", "-c"]
    args:
    - |
      import os, socket, time
      name = f"head.{os.environ['NS']}.svc"
      while True:
          try:
              socket.create_connection((name, 29402), timeout=2).close()
              break
          except OSError as e:
              print("not yet:", e, flush=True)
              time.sleep(0.5)
      print("connected", socket.gethostbyname(name), flush=True)
    env: [{name: NS, valueFrom: {fieldRef: {fieldPath: metadata.namespace}}}]
""", namespace)
    wait_for(lambda: "not yet" in _log_or_empty(cluster, namespace, "client", "main"), timeout_s=30,
             what="client running before its server exists")
    apply(cluster, """
apiVersion: v1
kind: Service
metadata: {name: head}
spec:
  clusterIP: None
  publishNotReadyAddresses: true
  selector: {app: head}
  ports: [{port: 29402}]
---
apiVersion: v1
kind: Pod
metadata: {name: head, labels: {app: head}}
spec:
  containers:
  - name: main
    image: python:3.11
    command: ["python", "-c"]
    args:
    - |
      import os, socket
      s = socket.create_server((socket.gethostbyname(os.environ["HOSTNAME"]), 29402))
      while True:
          s.accept()[0].close()
    readinessProbe: {exec: {command: ["false"]}, periodSeconds: 1}
""", namespace)
    done = wait_for(lambda: pod(cluster, namespace, "client")["status"].get("phase") == "Succeeded", timeout_s=60,
                    what="client connected through the headless name",
                    explain=lambda: _log_or_empty(cluster, namespace, "client", "main")[-1500:])
    assert done
    head = pod(cluster, namespace, "head")
    assert not is_ready(head)
    assert f"connected {head['status']['podIP']}" in cluster.container_log(namespace, "client", "main")
