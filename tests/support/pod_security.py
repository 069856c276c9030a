"""A checker for the Kubernetes Pod Security Standards, "baseline" and "restricted".

Written from the standard's text (kubernetes.io/docs/concepts/security/pod-security-standards,
the policies of v1.30+), one function per control, over a pod spec dict as the
operator renders it. The API server's PodSecurity admission is the real judge
(the e2e tier runs it); this lets unit tests hold every renderer to it.
"""

from __future__ import annotations

from typing import Any

_BASELINE_CAPABILITIES = {"AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD",
                          "NET_BIND_SERVICE", "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT"}
_SAFE_SYSCTLS = {"kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range", "net.ipv4.ip_unprivileged_port_start",
                 "net.ipv4.tcp_syncookies", "net.ipv4.ping_group_range", "net.ipv4.ip_local_reserved_ports",
                 "net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout", "net.ipv4.tcp_keepalive_intvl",
                 "net.ipv4.tcp_keepalive_probes"}
_SELINUX_TYPES = {"", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"}
_RESTRICTED_VOLUMES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim",
                       "projected", "secret"}
_SECCOMP_OK = {"RuntimeDefault", "Localhost"}


def _containers(spec: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for field in ("initContainers", "containers", "ephemeralContainers"):
        out += [(f"{field}[{c.get('name')}]", c) for c in spec.get(field) or []]
    return out


def baseline_violations(spec: dict[str, Any]) -> list[str]:
    """Every "baseline" control `spec` (a PodSpec dict) breaks, one line each."""
    out: list[str] = []
    psc = spec.get("securityContext") or {}
    if (psc.get("windowsOptions") or {}).get("hostProcess"):
        out.append("HostProcess: spec.securityContext.windowsOptions.hostProcess")
    for ns in ("hostNetwork", "hostPID", "hostIPC"):
        if spec.get(ns):
            out.append(f"Host Namespaces: spec.{ns}")
    for v in spec.get("volumes") or []:
        if "hostPath" in v:
            out.append(f"HostPath Volumes: volume {v['name']}")
    for sysctl in psc.get("sysctls") or []:
        if sysctl.get("name") not in _SAFE_SYSCTLS:
            out.append(f"Sysctls: {sysctl.get('name')}")
    contexts = [("spec", psc)] + [(where, c.get("securityContext") or {}) for where, c in _containers(spec)]
    for where, sc in contexts:
        if (sc.get("seccompProfile") or {}).get("type") == "Unconfined":
            out.append(f"Seccomp: {where} Unconfined")
        selinux = sc.get("seLinuxOptions") or {}
        if selinux.get("type", "") not in _SELINUX_TYPES or selinux.get("user") or selinux.get("role"):
            out.append(f"SELinux: {where}")
        if (sc.get("appArmorProfile") or {}).get("type") not in (None, "RuntimeDefault", "Localhost"):
            out.append(f"AppArmor: {where}")
    for where, c in _containers(spec):
        sc = c.get("securityContext") or {}
        if sc.get("privileged"):
            out.append(f"Privileged Containers: {where}")
        added = set((sc.get("capabilities") or {}).get("add") or [])
        if added - _BASELINE_CAPABILITIES:
            out.append(f"Capabilities: {where} adds {sorted(added - _BASELINE_CAPABILITIES)}")
        if sc.get("procMount", "Default") != "Default":
            out.append(f"/proc Mount Type: {where}")
        for p in c.get("ports") or []:
            if p.get("hostPort"):
                out.append(f"Host Ports: {where} hostPort {p['hostPort']}")
    return out


def restricted_violations(spec: dict[str, Any]) -> list[str]:
    """Every "restricted" control (baseline's included) `spec` breaks, one line each."""
    out = baseline_violations(spec)
    psc = spec.get("securityContext") or {}
    for v in spec.get("volumes") or []:
        kinds = set(v) - {"name"}
        if not kinds <= _RESTRICTED_VOLUMES:
            out.append(f"Volume Types: volume {v['name']} is {sorted(kinds)}")
    if psc.get("runAsUser") == 0:
        out.append("Running as Non-root user: spec.securityContext.runAsUser 0")
    for where, c in _containers(spec):
        sc = c.get("securityContext") or {}
        if sc.get("allowPrivilegeEscalation") is not False:
            out.append(f"Privilege Escalation: {where} allowPrivilegeEscalation is not false")
        if not (sc.get("runAsNonRoot") is True or (psc.get("runAsNonRoot") is True and sc.get("runAsNonRoot") is not False)):
            out.append(f"Running as Non-root: {where}")
        if sc.get("runAsUser") == 0:
            out.append(f"Running as Non-root user: {where} runAsUser 0")
        seccomp = (sc.get("seccompProfile") or psc.get("seccompProfile") or {}).get("type")
        if seccomp not in _SECCOMP_OK:
            out.append(f"Seccomp: {where} has no RuntimeDefault/Localhost profile")
        caps = sc.get("capabilities") or {}
        if "ALL" not in (caps.get("drop") or []):
            out.append(f"Capabilities: {where} does not drop ALL")
        if set(caps.get("add") or []) - {"NET_BIND_SERVICE"}:
            out.append(f"Capabilities: {where} adds more than NET_BIND_SERVICE")
    return out
