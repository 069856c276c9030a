"""A kind node image built here, offline: Debian packages, our Go binaries, our own node files.

kind's published node images (``kindest/node``) cannot be pulled on these
machines, so :mod:`e2e.kind.nodeimage.build` makes one that ``kind create
cluster`` accepts (kind's "Node Image" contract: systemd, containerd, runc,
CNI plugins and crictl; ``kubeadm``/``kubelet``/``kubectl`` on PATH with a
kubelet unit; image archives in ``/kind/images``; ``/kind/version``; the
manifests in ``/kind/manifests``). The files baked into it are in ``files/``
and the recipe in ``Dockerfile`` (node) and ``component.Dockerfile`` (the
control-plane, kube-proxy, etcd, CoreDNS, pause, tools and JobSet images that
the node preloads).
"""
