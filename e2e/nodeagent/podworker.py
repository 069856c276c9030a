"""One pod on this node: start its containers, watch them, report status, tear down.

The rules follow the kubelet:
- phase: Pending until every container has started; Running while any runs or
  will be restarted; Succeeded when all exited 0 and none restarts; Failed
  otherwise. Succeeded/Failed are final.
- ``restartPolicy``: Always restarts any exit, OnFailure non-zero exits, Never
  none; restarts back off (1 s doubling to 10 s here, 10 s to 5 min upstream)
  and count in ``restartCount``, showing ``CrashLoopBackOff`` while waiting.
- deletion: SIGTERM to each container's process group, SIGKILL after the
  pod's ``deletionGracePeriodSeconds``, final status, then the pod object is
  deleted with grace 0, as the kubelet confirms a deletion.
- ``activeDeadlineSeconds``: past it, the containers are killed and the pod
  Fails with reason ``DeadlineExceeded``.
- an image missing from ``images.py`` fails the pod at once with reason
  ``ErrImagePull`` (the kubelet would retry a registry; there is none).
"""

from __future__ import annotations

import signal
import shutil
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from e2e.nodeagent import containers, dns, envvars, images, probes, volumes
from e2e.nodeagent.kubeapi import ApiError, KubeApi

BACKOFF_START_S = 1.0
BACKOFF_MAX_S = 10.0
DEFAULT_GRACE_S = 30


def now_iso() -> str:
    """RFC 3339 timestamp, second precision, as the API stores it."""
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class NodeContext:
    """What every pod worker on one node shares."""

    api: KubeApi
    node_name: str
    host_ip: str
    api_host: str
    api_port: int
    pods_dir: Path
    path_prefix: str  # PATH entries put first in every container (the venv's bin)
    created_mountpoints: Path
    marker_env: dict[str, str]
    dns: "dns.HeadlessNames | None" = None  # headless Service names for pods' /etc/hosts (None: none)


class ContainerRun:
    """State of one container across its restarts."""

    def __init__(self, spec: dict, init: bool):
        self.spec = spec
        self.name: str = spec["name"]
        self.init = init
        self.proc = None
        self.env: dict[str, str] = {}
        self.argv: list[str] = []
        self.started_at: str | None = None
        self.started_mono = 0.0
        self.state: dict = {"waiting": {"reason": "ContainerCreating"}}
        self.last_state: dict = {}
        self.restart_count = 0
        self.ever_started = False
        self.next_start_mono = 0.0
        self.done = False  # terminated and will not be restarted
        self.exit_code: int | None = None
        self.probe = probes.Probe(spec["readinessProbe"], spec) if spec.get("readinessProbe") else None
        self.liveness = probes.Probe(spec["livenessProbe"], spec) if spec.get("livenessProbe") else None
        self.startup = probes.Probe(spec["startupProbe"], spec) if spec.get("startupProbe") else None
        self.probe_kill_at: float | None = None  # SIGKILL time after a failed liveness/startup probe

    @property
    def running(self) -> bool:
        return self.proc is not None

    @property
    def started_ok(self) -> bool:
        """Running and past its startup probe (if any): the ``started`` field."""
        return self.running and (self.startup is None or self.startup.ready)

    @property
    def ready(self) -> bool:
        if not self.started_ok:
            return False
        return self.probe.ready if self.probe else True

    def status(self, image_ref: str) -> dict:
        out = {
            "name": self.name, "image": image_ref, "imageID": f"local://{image_ref}",
            "state": self.state, "lastState": self.last_state,
            "ready": self.ready, "restartCount": self.restart_count,
            "started": self.started_ok,
        }
        if self.proc is not None:
            out["containerID"] = f"process://{self.proc.pid}"
        return out


class PodWorker:
    """Drives one pod; :meth:`sync` is called by the agent loop with the latest object.

    Args:
        ctx: the node's shared context.
        pod: the Pod object as first seen.
        pod_ip: the loopback address reserved for this pod.
    """

    def __init__(self, ctx: NodeContext, pod: dict, pod_ip: str):
        self.ctx = ctx
        self.pod = pod
        self.uid = pod["metadata"]["uid"]
        self.ns = pod["metadata"]["namespace"]
        self.name = pod["metadata"]["name"]
        self.pod_ip = pod_ip
        self.dir = ctx.pods_dir / self.ns / self.name / self.uid
        spec = pod["spec"]
        self.restart_policy = spec.get("restartPolicy", "Always")
        self.init_runs = [ContainerRun(c, True) for c in spec.get("initContainers") or []]
        self.runs = [ContainerRun(c, False) for c in spec.get("containers") or []]
        self.start_time = (pod.get("status") or {}).get("startTime") or now_iso()
        self.start_mono = time.monotonic()
        self.phase = "Pending"
        self.reason: str | None = None
        self.message: str | None = None
        self.mounts_ready = False
        self.volume_paths: dict[str, Path] = {}
        self.setup_error: str | None = None
        self.kill_deadline: float | None = None
        self.sent_status: dict | None = None
        self.deleted = False
        self.conditions: dict[str, dict] = {}
        self.images: dict[str, images.Image] = {}
        self.hosts_text: str | None = None
        self.initialized = False  # every init container completed, every sidecar started, once

    # ---- helpers -----------------------------------------------------------------

    @property
    def api_path(self) -> str:
        return f"/api/v1/namespaces/{self.ns}/pods/{self.name}"

    @property
    def terminal(self) -> bool:
        return self.phase in ("Succeeded", "Failed")

    def _all_runs(self) -> list[ContainerRun]:
        return self.init_runs + self.runs

    def _fail(self, reason: str, message: str) -> None:
        self.phase, self.reason, self.message = "Failed", reason, message

    # ---- setup -------------------------------------------------------------------

    def _resolve_images(self) -> bool:
        for run in self._all_runs():
            ref = run.spec.get("image", "")
            try:
                self.images[run.name] = images.resolve(ref)
            except images.UnknownImage as e:
                run.state = {"waiting": {"reason": "ErrImagePull", "message": str(e)}}
                self._fail("ErrImagePull", str(e))
                return False
        return True

    def _base_env(self, image: images.Image) -> dict[str, str]:
        env = {
            "PATH": f"{self.ctx.path_prefix}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "HOME": "/root",
            "HOSTNAME": self.pod["spec"].get("hostname") or self.name,
            # No kube-proxy: the kubernetes Service is the API server itself.
            "KUBERNETES_SERVICE_HOST": self.ctx.api_host,
            "KUBERNETES_SERVICE_PORT": str(self.ctx.api_port),
            "KUBERNETES_SERVICE_PORT_HTTPS": str(self.ctx.api_port),
            "KUBERNETES_PORT": f"tcp://{self.ctx.api_host}:{self.ctx.api_port}",
            **self.ctx.marker_env,
        }
        env.update(image.env)
        return env

    def _hosts_file(self) -> Path:
        """The pod's /etc/hosts: localhost and its own name, like the kubelet writes, then the namespace's
        headless Service names (`dns`: CoreDNS's part). Rewritten in place (the same inode, which every
        container has bind-mounted) when those names change."""
        spec = self.pod["spec"]
        host = spec.get("hostname") or self.name
        names = [host]
        if spec.get("subdomain"):
            names.insert(0, f"{host}.{spec['subdomain']}.{self.ns}.svc.cluster.local")
        text = ("127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n"
                f"{self.pod_ip}\t{' '.join(names)}\n")
        if self.ctx.dns is not None:
            text += dns.hosts_lines(self.ctx.dns.records(self.ns))
        path = self.dir / "etc-hosts"
        if self.hosts_text != text:
            with open(path, "w") as f:  # truncate, not replace: the bind mounts keep the inode
                f.write(text)
            self.hosts_text = text
        return path

    def _mounts(self, spec: dict) -> list[containers.Mount]:
        mounts = [containers.Mount(self._hosts_file(), "/etc/hosts", read_only=False)]
        for vm in spec.get("volumeMounts") or []:
            src = self.volume_paths.get(vm["name"])
            if src is None:
                raise volumes.VolumeError(f"volumeMount {vm['name']} names no volume of the pod")
            if vm.get("subPath"):
                src = src / vm["subPath"]
            mounts.append(containers.Mount(src, vm["mountPath"], vm.get("readOnly", False)))
        return mounts

    def _setup(self) -> bool:
        """Images, volumes, pod IP; True when containers may start."""
        if not self.images and not self._resolve_images():
            return False
        if not self.mounts_ready:
            try:
                self.dir.mkdir(parents=True, exist_ok=True)
                self.volume_paths = volumes.materialize(self.ctx.api, self._with_status(), self.dir)
            except (volumes.VolumeError, ApiError) as e:
                self.setup_error = f"MountVolume.SetUp failed: {e}"
                for run in self._all_runs():
                    run.state = {"waiting": {"reason": "ContainerCreating", "message": self.setup_error}}
                return False
            self.mounts_ready = True
            self.setup_error = None
        return True

    def _with_status(self) -> dict:
        """The pod object with the IPs we assigned (downward API reads status.podIP)."""
        pod = dict(self.pod)
        status = dict(pod.get("status") or {})
        status.update({"podIP": self.pod_ip, "hostIP": self.ctx.host_ip})
        pod["status"] = status
        return pod

    def _start(self, run: ContainerRun) -> None:
        image = self.images[run.name]
        spec = run.spec
        try:
            base = self._base_env(image)
            run.env = envvars.build(self.ctx.api, self._with_status(), spec, base)
            argv = images.argv(image, spec.get("command"), spec.get("args"))
            run.argv = [envvars.expand(a, run.env) for a in argv]
            mounts = self._mounts(spec)
            for m in mounts:
                containers.ensure_mountpoint(m, self.ctx.created_mountpoints)
        except (envvars.EnvError, volumes.VolumeError, ValueError, ApiError) as e:
            run.state = {"waiting": {"reason": "CreateContainerConfigError", "message": str(e)}}
            run.next_start_mono = time.monotonic() + BACKOFF_START_S
            return
        workdir = spec.get("workingDir") or str(self.dir / "rootfs" / run.name)
        if not spec.get("workingDir"):
            for rel, source in image.files:  # the image's own files at its WORKDIR
                target = Path(workdir) / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(source, target)
        run.proc = containers.start(run.argv, env=run.env, mounts=mounts, workdir=workdir,
                                    log_path=self.dir / "logs" / f"{run.name}.log",
                                    pid_path=self.dir / "pids" / f"{run.name}.pid")
        run.started_at = now_iso()
        run.started_mono = time.monotonic()
        run.ever_started = True
        run.state = {"running": {"startedAt": run.started_at}}
        for probe in (run.probe, run.liveness, run.startup):
            if probe:
                probe.reset(run.started_mono)
        run.probe_kill_at = None

    # ---- running -----------------------------------------------------------------

    def _restart_wanted(self, run: ContainerRun, code: int) -> bool:
        policy = run.spec.get("restartPolicy") if run.init else None  # sidecars: Always
        policy = policy or self.restart_policy
        if run.init and policy != "Always" and code == 0:
            return False
        return policy == "Always" or (policy == "OnFailure" and code != 0)

    def _termination_message(self, run: ContainerRun, code: int) -> str:
        """`terminationMessagePolicy: FallbackToLogsOnError`, as the kubelet does it: a failed
        container's message is the tail of its log, at most 80 lines and 2048 bytes
        (kubelet's MaxContainerTerminationMessageLogLines/-Length). No message file is
        mounted here, so `File` (the default) gives no message."""
        if code == 0 or run.spec.get("terminationMessagePolicy") != "FallbackToLogsOnError":
            return ""
        try:
            tail = (self.dir / "logs" / f"{run.name}.log").read_bytes()[-2048:]
        except OSError:
            return ""
        return "\n".join(tail.decode(errors="replace").splitlines()[-80:])

    def _reap(self, run: ContainerRun, now: float) -> bool:
        """Notice an exited process; returns True when something changed."""
        if run.proc is None or run.proc.poll() is None:
            return False
        code = containers.exit_code(run.proc.returncode)
        # A container ends with its main process: whatever it started in its
        # process group goes too (a runtime tears down the container's PID namespace).
        containers.signal_group(run.proc, signal.SIGKILL)
        run.proc = None
        run.exit_code = code
        terminated = {"exitCode": code, "reason": "Completed" if code == 0 else "Error",
                      "startedAt": run.started_at, "finishedAt": now_iso(),
                      "containerID": run.state.get("running", {}).get("containerID", ""),
                      "message": self._termination_message(run, code)}
        terminated = {k: v for k, v in terminated.items() if v != ""}
        if self.kill_deadline is None and self._restart_wanted(run, code) and not self.terminal:
            run.last_state = {"terminated": terminated}
            delay = min(BACKOFF_MAX_S, BACKOFF_START_S * (2 ** run.restart_count))
            run.restart_count += 1
            run.next_start_mono = now + delay
            run.state = {"waiting": {"reason": "CrashLoopBackOff",
                                     "message": f"back-off {delay:.0f}s restarting failed container={run.name} "
                                                f"pod={self.name}_{self.ns}({self.uid})"}}
        else:
            run.state = {"terminated": terminated}
            run.done = True
        return True

    def _kill_all(self, sig: int) -> None:
        for run in self._all_runs():
            if run.proc is not None:
                containers.signal_group(run.proc, sig)

    def _begin_kill(self, grace_s: float) -> None:
        if self.kill_deadline is None:
            self.kill_deadline = time.monotonic() + grace_s
            self._kill_all(signal.SIGTERM)
            for run in self._all_runs():
                if run.proc is None:
                    run.done = True
                    # An image that cannot be pulled keeps saying so (kubectl shows ErrImagePull).
                    if "waiting" in run.state and not run.ever_started and self.reason != "ErrImagePull":
                        run.state = {"terminated": {"exitCode": 0, "reason": "ContainerStatusUnknown",
                                                    "message": "The container was never started"}}

    def _any_alive(self) -> bool:
        return any(run.proc is not None for run in self._all_runs())

    def _compute_phase(self) -> None:
        if self.terminal:
            return
        if any(not r.done for r in self.init_runs if r.spec.get("restartPolicy") != "Always"):
            return  # still initializing: Pending
        if not all(r.ever_started or r.done for r in self.runs):
            return  # a container has not started yet: Pending
        if any(not r.done for r in self.runs):
            self.phase = "Running"
            return
        self.phase = "Succeeded" if all(r.exit_code == 0 for r in self.runs) else "Failed"

    def _step_containers(self, now: float) -> None:
        # Init containers one by one (restartPolicy: Always ones are sidecars: start and move on).
        for run in self.init_runs:
            self._reap(run, now)
            sidecar = run.spec.get("restartPolicy") == "Always"
            if run.done:
                if run.exit_code not in (0, None) and self.restart_policy == "Never":
                    self._fail("Init:Error", f"init container {run.name} exited with {run.exit_code}")
                    return
                continue
            if run.proc is None and now >= run.next_start_mono and self.kill_deadline is None:
                self._start(run)
            # Once initialized, a sidecar that restarts holds nothing back (as the kubelet).
            if self.initialized or (sidecar and run.started_ok):
                continue
            return  # wait for this init container (a sidecar: until its startupProbe passed, as the kubelet)
        self.initialized = True
        for run in self.runs:
            self._reap(run, now)
            if run.proc is None and not run.done and now >= run.next_start_mono and self.kill_deadline is None:
                self._start(run)

    def _step_probes(self, now: float) -> None:
        """Run due probes; a failed startup or liveness probe restarts the container.

        Readiness and liveness wait for the startup probe to succeed, as upstream.
        The kill is SIGTERM, then SIGKILL after the pod's termination grace.
        """
        for run in self._all_runs():
            if run.proc is None:
                continue
            pid, env = run.proc.pid, run.env
            if run.probe_kill_at is not None:
                if now >= run.probe_kill_at:
                    containers.signal_group(run.proc, signal.SIGKILL)
                continue
            if run.startup and not run.startup.ready:
                run.startup.maybe_run(now, self.pod_ip, pid, env)
                doomed = run.startup.failed
            else:
                if run.probe:
                    run.probe.maybe_run(now, self.pod_ip, pid, env)
                doomed = False
                if run.liveness:
                    run.liveness.maybe_run(now, self.pod_ip, pid, env)
                    doomed = run.liveness.failed
            if doomed:
                containers.signal_group(run.proc, signal.SIGTERM)
                grace = self.pod["spec"].get("terminationGracePeriodSeconds", DEFAULT_GRACE_S)
                run.probe_kill_at = now + grace

    # ---- status --------------------------------------------------------------------

    def _condition(self, ctype: str, ok: bool, reason: str | None = None) -> dict:
        status = "True" if ok else "False"
        prev = self.conditions.get(ctype)
        if prev is None or prev["status"] != status:
            prev = {"type": ctype, "status": status, "lastTransitionTime": now_iso()}
            if reason and not ok:
                prev["reason"] = reason
            self.conditions[ctype] = prev
        return prev

    def status(self) -> dict:
        """The pod status as the kubelet would report it now."""
        spec = self.pod["spec"]
        init_done = all(r.done and r.exit_code == 0 or (r.spec.get("restartPolicy") == "Always" and r.running)
                        for r in self.init_runs)
        ready = (not self.terminal and self.kill_deadline is None
                 and all(r.ready for r in self.runs) and bool(self.runs))
        conditions = [
            self._condition("PodReadyToStartContainers", self.mounts_ready),
            self._condition("Initialized", init_done, "ContainersNotInitialized"),
            self._condition("ContainersReady", ready, "ContainersNotReady"),
            self._condition("Ready", ready, "ContainersNotReady"),
        ]
        status = {
            "phase": self.phase,
            "conditions": conditions,
            "hostIP": self.ctx.host_ip, "hostIPs": [{"ip": self.ctx.host_ip}],
            "podIP": self.pod_ip, "podIPs": [{"ip": self.pod_ip}],
            "startTime": self.start_time,
            "containerStatuses": [r.status(c.get("image", "")) for r, c in zip(self.runs, spec["containers"])],
        }
        if self.init_runs:
            status["initContainerStatuses"] = [r.status(c.get("image", ""))
                                               for r, c in zip(self.init_runs, spec["initContainers"])]
        if self.reason:
            status["reason"] = self.reason
        if self.message:
            status["message"] = self.message
        return status

    def _report(self) -> None:
        status = self.status()
        if status == self.sent_status:
            return
        try:
            self.ctx.api.strategic_patch(f"{self.api_path}/status", {"status": _with_deletions(status)})
            self.sent_status = status
        except ApiError as e:
            if e.status != 404:
                raise

    # ---- the loop --------------------------------------------------------------------

    def sync(self, pod: dict | None) -> bool:
        """Advance the pod one step with its latest object (None: gone from the API).

        Returns:
            True when the worker is finished (processes gone, pod deleted or terminal).
        """
        now = time.monotonic()
        if pod is None or pod["metadata"]["uid"] != self.uid:
            # Force-deleted (or replaced by a same-name pod): no grace left.
            self._kill_all(signal.SIGKILL)
            for run in self._all_runs():
                self._reap_blocking(run)
            return True
        self.pod = pod
        meta = pod["metadata"]

        if meta.get("deletionTimestamp"):
            grace = meta.get("deletionGracePeriodSeconds")
            self._begin_kill(DEFAULT_GRACE_S if grace is None else grace)
        elif not self.terminal:
            deadline = pod["spec"].get("activeDeadlineSeconds")
            if deadline is not None and now - self.start_mono >= deadline:
                self._fail("DeadlineExceeded", "Pod was active on the node longer than the specified deadline")
                self._begin_kill(pod["spec"].get("terminationGracePeriodSeconds", DEFAULT_GRACE_S))

        if self.kill_deadline is not None:
            for run in self._all_runs():
                self._reap(run, now)
            if self._any_alive() and now >= self.kill_deadline:
                self._kill_all(signal.SIGKILL)
                for run in self._all_runs():
                    self._reap_blocking(run)
            if not self._any_alive():
                if not self.terminal:
                    codes = [r.exit_code for r in self.runs]
                    self.phase = "Succeeded" if codes and all(c == 0 for c in codes) else "Failed"
                self._report()
                if meta.get("deletionTimestamp") and not self.deleted:
                    self._confirm_deletion()
                return self.deleted or not meta.get("deletionTimestamp")
            self._report()
            return False

        if self.terminal:
            self._report()
            return False
        if self._setup():
            self._step_containers(now)
            self._step_probes(now)
            if self.ctx.dns is not None and self._any_alive():
                self._hosts_file()  # headless Service names as they are now
        self._compute_phase()
        if self.terminal:
            self._begin_kill(0)  # e.g. a sidecar still running after the main containers ended
        self._report()
        return False

    def _reap_blocking(self, run: ContainerRun) -> None:
        if run.proc is not None:
            try:
                run.proc.wait(timeout=5)
            except Exception:
                pass
            self._reap(run, time.monotonic())

    def _confirm_deletion(self) -> None:
        """Delete the pod object with grace 0: the kubelet's "containers are gone"."""
        try:
            self.ctx.api.delete(self.api_path, {"apiVersion": "v1", "kind": "DeleteOptions",
                                                "gracePeriodSeconds": 0,
                                                "preconditions": {"uid": self.uid}})
        except ApiError as e:
            if e.status not in (404, 409):
                raise
        self.deleted = True

    def shutdown(self, grace_s: float) -> None:
        """Agent stopping: stop the processes (SIGTERM, SIGKILL after ``grace_s``); no API calls."""
        self._kill_all(signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while self._any_alive() and time.monotonic() < deadline:
            for run in self._all_runs():
                if run.proc is not None and run.proc.poll() is not None:
                    run.proc = None
            time.sleep(0.05)
        self._kill_all(signal.SIGKILL)
        for run in self._all_runs():
            if run.proc is not None:
                try:
                    run.proc.wait(timeout=5)
                except Exception:
                    pass
                run.proc = None


_STATES = ("waiting", "running", "terminated")


def _with_deletions(status: dict) -> dict:
    """Spell out the container states a patch must remove.

    A strategic merge patch merges maps, so ``state: {running: ...}`` sent over
    ``state: {waiting: ...}`` would keep both; explicit nulls delete the
    others, as the kubelet's computed two-way patch does.
    """
    out = dict(status)
    for key in ("containerStatuses", "initContainerStatuses"):
        if key in out:
            out[key] = [{**cs, "state": {k: cs["state"].get(k) for k in _STATES},
                         "lastState": {k: cs["lastState"].get(k) for k in _STATES}} for cs in out[key]]
    return out
