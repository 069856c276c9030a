package main

// The coredns part: CoreDNS built as a library with only the plugins that
// kubeadm's default Corefile uses (its addons/dns manifests), so the cluster
// DNS image holds the version kubeadm expects without CoreDNS's own binary
// and its cloud back-ends.

import (
	"flag"

	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	// The plugins of kubeadm's default Corefile, and nothing else.
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/forward"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/loadbalance"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/loop"
	_ "github.com/coredns/coredns/plugin/metrics"
	_ "github.com/coredns/coredns/plugin/ready"
	_ "github.com/coredns/coredns/plugin/reload"
)

// corednsDirectives is the order in which CoreDNS chains the plugins of a
// server block: the order of CoreDNS's plugin.cfg, restricted to the plugins
// imported above. (The order in a Corefile does not matter; this does.)
var corednsDirectives = []string{
	"reload",
	"ready",
	"health",
	"prometheus",
	"errors",
	"log",
	"loadbalance",
	"cache",
	"kubernetes",
	"loop",
	"forward",
}

// corednsFlags are the flags CoreDNS's coremain adds to the standard flag set
// when the binary starts (its init, which its kubernetes and metrics plugins
// pull in whatever part runs).
var corednsFlags = map[string]bool{
	"conf": true, "dns.port": true, "p": true, "pidfile": true, "plugins": true, "quiet": true, "version": true,
}

// hideCorednsFlags removes CoreDNS's flags from the standard flag set, so the
// parts that publish it (the kubelet, kubeadm) neither list nor accept them.
func hideCorednsFlags() {
	kept := flag.NewFlagSet(flag.CommandLine.Name(), flag.CommandLine.ErrorHandling())
	flag.CommandLine.VisitAll(func(f *flag.Flag) {
		if !corednsFlags[f.Name] {
			kept.Var(f.Value, f.Name, f.Usage)
		}
	})
	flag.CommandLine = kept
}

func init() {
	parts["coredns"] = func(args []string) int {
		dnsserver.Directives = corednsDirectives
		// coremain parses the standard flag set from os.Args (set by main)
		// and blocks until CoreDNS stops; it exits by itself on errors.
		coremain.Run()
		return 0
	}
}
