package main

// The node parts: what a kind node runs (kubelet, kubeadm) and what its
// kube-proxy DaemonSet runs. They come from the same pinned k8s.io/kubernetes
// release as the control-plane parts in main.go and share their compiled code.

import (
	"context"

	"github.com/spf13/cobra"
	kubeproxy "k8s.io/kubernetes/cmd/kube-proxy/app"
	kubeadm "k8s.io/kubernetes/cmd/kubeadm/app"
	kubeadmerrors "k8s.io/kubernetes/cmd/kubeadm/app/util/errors"
	kubelet "k8s.io/kubernetes/cmd/kubelet/app"
)

func init() {
	parts["kubelet"] = cobraPart(func() *cobra.Command { return kubelet.NewKubeletCommand(context.Background()) })
	parts["kube-proxy"] = cobraPart(kubeproxy.NewProxyCommand)
	parts["kubeadm"] = func(args []string) int {
		// kubeadm's own main: cobra reads os.Args (set by main), errors exit non-zero.
		kubeadmerrors.HandleError(kubeadm.Run())
		return 0
	}
}
