"""Builds, starts, reuses and stops the local e2e cluster.

Modules, one job each:
- ``paths``: where binaries, state and logs live.
- ``build``: runs ``e2e/build.sh`` (Go builds, cached).
- ``processes``: start a process with a log and a PID file; stop it by PID;
  find anything we started that is still running.
- ``controlplane``: etcd, kube-apiserver, kube-controller-manager,
  kube-scheduler flags and health checks.
- ``jobset``: the JobSet CRD, its webhooks (served on 127.0.0.1) and controller.
- ``layout``: the simulated GKE node pools.
- ``cluster``: the whole cluster: start, reuse, fail a node, stop.
"""
