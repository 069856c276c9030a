"""A process-based stand-in for the kubelet, for the local e2e cluster.

One agent process per Node. It registers the Node, keeps its Ready condition
and Lease fresh, and runs every pod the real scheduler binds to it as local
processes: one per container, each in its own mount namespace (``unshare``)
where the pod's volumes (ServiceAccount token, Secrets, ConfigMaps, emptyDirs)
appear at their mount paths. It reports pod status the way the kubelet does.

Modules, one job each:
- ``kubeapi``: a small JSON REST client for the API server (stdlib only).
- ``node``: Node registration, status and Lease heartbeats.
- ``images``: the table from image name to local command.
- ``envvars``: container environment (downward API, Secret/ConfigMap refs, ``$(VAR)``).
- ``volumes``: writes a pod's volumes to files.
- ``containers``: one container's process: start in a mount namespace, signal, reap.
- ``mountexec``: runs inside the new mount namespace: mounts, then execs the container.
- ``probes``: readiness probes (exec, httpGet, tcpSocket).
- ``dns``: headless Service names for the pods' /etc/hosts (CoreDNS's part).
- ``podworker``: one pod's lifecycle and its status.
- ``agent``: the watch and the loop that drives all pod workers.
"""
