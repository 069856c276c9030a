// Command localcluster is one binary that holds every Kubernetes control-plane
// part the e2e suite starts (etcd, kube-apiserver, kube-controller-manager,
// kube-scheduler), the kubectl client, a small "pki" tool that writes the
// cluster's certificates and kubeconfig, and what the kind node image runs
// (kubelet, kubeadm, kube-proxy, CoreDNS and pause; node.go, coredns.go,
// pause.go).
//
// One binary instead of five because linking a k8s.io/kubernetes binary is the
// slowest step of the build on a 2-core machine: the shared code is compiled
// and linked once. The part to run is chosen by the name the binary is called
// by (the build script makes symlinks such as kube-apiserver -> localcluster),
// or by the first argument: `localcluster kube-apiserver --help`.
package main

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"

	_ "time/tzdata" // CronJob time zones, as in the upstream kube-controller-manager main.

	"github.com/spf13/cobra"
	"go.etcd.io/etcd/server/v3/etcdmain"
	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"          // --logging-format=json, as upstream.
	_ "k8s.io/component-base/metrics/prometheus/clientgo" // client-go metrics, as upstream.
	_ "k8s.io/component-base/metrics/prometheus/version"  // build-info metric, as upstream.
	kubectlcmd "k8s.io/kubectl/pkg/cmd"
	kubectlutil "k8s.io/kubectl/pkg/cmd/util"
	apiserver "k8s.io/kubernetes/cmd/kube-apiserver/app"
	controllermanager "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	scheduler "k8s.io/kubernetes/cmd/kube-scheduler/app"
)

// parts maps a part's name to a function that runs it with the given
// arguments (without the part name) and returns the process exit code.
var parts = map[string]func(args []string) int{
	"etcd": func(args []string) int {
		// etcdmain parses os.Args itself and exits on its own.
		etcdmain.Main(append([]string{"etcd"}, args...))
		return 0
	},
	"kube-apiserver":          cobraPart(apiserver.NewAPIServerCommand),
	"kube-controller-manager": cobraPart(controllermanager.NewControllerManagerCommand),
	"kube-scheduler":          cobraPart(func() *cobra.Command { return scheduler.NewSchedulerCommand() }),
	"kubectl": func(args []string) int {
		c := kubectlcmd.NewDefaultKubectlCommand()
		c.SetArgs(args)
		if err := cli.RunNoErrOutput(c); err != nil {
			// Prints the error the way kubectl does and exits 1.
			kubectlutil.CheckErr(err)
		}
		return 0
	},
	"pki": runPKI,
}

// cobraPart runs a component's upstream cobra command the way its own main does.
func cobraPart(newCommand func() *cobra.Command) func(args []string) int {
	return func(args []string) int {
		c := newCommand()
		c.SetArgs(args)
		return cli.Run(c)
	}
}

func usage() int {
	names := make([]string, 0, len(parts))
	for n := range parts {
		names = append(names, n)
	}
	sort.Strings(names)
	fmt.Fprintf(os.Stderr, "usage: localcluster PART [args...]  (or call it through a symlink named PART)\nparts: %v\n", names)
	return 2
}

func main() {
	name := filepath.Base(os.Args[0])
	args := os.Args[1:]
	run, ok := parts[name]
	if !ok {
		if len(args) == 0 {
			os.Exit(usage())
		}
		run, ok = parts[args[0]]
		if !ok {
			fmt.Fprintf(os.Stderr, "localcluster: unknown part %q\n", args[0])
			os.Exit(usage())
		}
		name, args = args[0], args[1:]
	}
	// Parts that read os.Args themselves (etcd, kubectl plugins) must see
	// their own name first, as if they were separate binaries.
	os.Args = append([]string{name}, args...)
	if name != "coredns" {
		hideCorednsFlags()
	}
	os.Exit(run(args))
}
