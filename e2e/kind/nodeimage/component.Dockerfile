# The images a kind node preloads (e2e/kind/nodeimage/build.py tags them the
# way `kubeadm config images list` names them). All but `jobset` hold the same
# files: the multi-call localcluster binary with one symlink per part, on a
# small Debian base (iptables, conntrack and iproute2 for kube-proxy and the
# bridge-cni DaemonSet, busybox for tests). They share every layer, so the
# node's /kind/images/preload.tar holds the binary once. kubeadm's manifests
# name each component's command, so only CoreDNS and pause need an entrypoint.
#
# Build context: localcluster and jobset-controller (from e2e/.build/bin).
ARG BASE_IMAGE

FROM ${BASE_IMAGE} AS parts
ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
COPY localcluster /usr/local/bin/localcluster
RUN set -eu; \
    for part in etcd kube-apiserver kube-controller-manager kube-scheduler kube-proxy kubectl kubeadm kubelet coredns pause; do \
      ln -s localcluster "/usr/local/bin/$part"; \
    done; \
    ln -s /usr/local/bin/localcluster /coredns; \
    ln -s /usr/local/bin/localcluster /pause

# registry.k8s.io/coredns/coredns: kubeadm passes only args (-conf ...).
FROM parts AS coredns
ENTRYPOINT ["/coredns"]

# registry.k8s.io/pause: containerd's sandbox image.
FROM parts AS pause
ENTRYPOINT ["/pause"]

# etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kube-proxy and
# the tools image: their manifests give the command.
FROM parts AS component

# The JobSet controller, as upstream's image: /manager, a non-root user.
FROM ${BASE_IMAGE} AS jobset
COPY jobset-controller /manager
USER 65532:65532
ENTRYPOINT ["/manager"]
