package main

// The pause part: the process that holds a pod sandbox's namespaces (the
// kubelet's "pause" image). As PID 1 of the sandbox it reaps orphaned
// children, and it exits 0 on SIGINT or SIGTERM, like kubernetes'
// build/pause/linux/pause.c.

import (
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func runPause(args []string) int {
	for _, a := range args {
		if a == "-v" || a == "-V" {
			fmt.Println("pause (elastic-jax localcluster)")
			return 0
		}
	}
	if os.Getpid() != 1 {
		fmt.Fprintln(os.Stderr, "Warning: pause should be the first process")
	}
	signals := make(chan os.Signal, 8)
	signal.Notify(signals, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for sig := range signals {
		if sig != syscall.SIGCHLD {
			fmt.Fprintf(os.Stderr, "Shutting down, got signal: %v\n", sig)
			return 0
		}
		for {
			var status syscall.WaitStatus
			pid, err := syscall.Wait4(-1, &status, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
	return 0
}

func init() {
	parts["pause"] = runPause
}
