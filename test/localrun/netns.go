package main

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// netnsName is the name the run's network namespace is attached under (ip
// netns), so that a second terminal enters it: `ip netns exec deployguard
// bash`. The cluster, the node's address, its registry, the pods and the
// Services exist only there.
const netnsName = "deployguard"

// errNotRoot is why a real node needs root, said before anything is built
// or started.
var errNotRoot = errors.New("make run NODE=real runs as root: it creates a network namespace of its own " +
	"and runs the kubelet, containerd and runc (cgroups, mounts); run it as root (sudo), or run `make run`, whose nodes are kwok's, without")

// requireRoot is errNotRoot unless euid is root's.
func requireRoot(euid int) error {
	if euid != 0 {
		return errNotRoot
	}
	return nil
}

// forwardSignals passes SIGINT and SIGTERM on to this process's children
// until stop is called. Outside the network namespace the run is a child
// (harness.EnterOwnNetwork waits for it): Ctrl-C reaches both through the
// terminal, but a signal sent to this process alone must reach the run too,
// and this process must outlive the run's clean-up.
func forwardSignals() (stop func()) {
	ch := make(chan os.Signal, 2)
	signal.Notify(ch, os.Interrupt, syscall.SIGTERM)
	done := make(chan struct{})
	go func() {
		for {
			select {
			case s := <-ch:
				signalChildren(s.(syscall.Signal))
			case <-done:
				return
			}
		}
	}()
	return func() {
		signal.Stop(ch)
		close(done)
	}
}

// signalChildren sends sig to every process whose parent is this one.
func signalChildren(sig syscall.Signal) {
	self := os.Getpid()
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	for _, p := range stats {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		if ppid, ok := parentPID(string(b)); ok && ppid == self {
			pid, _ := strconv.Atoi(filepath.Base(filepath.Dir(p)))
			_ = syscall.Kill(pid, sig)
		}
	}
}

// parentPID reads the parent's PID from /proc/<pid>/stat: the field after the
// state, which follows the command name in parentheses (which may hold
// spaces and parentheses itself).
func parentPID(stat string) (int, bool) {
	i := strings.LastIndexByte(stat, ')')
	if i < 0 {
		return 0, false
	}
	f := strings.Fields(stat[i+1:])
	if len(f) < 2 {
		return 0, false
	}
	ppid, err := strconv.Atoi(f[1])
	return ppid, err == nil
}

// attachNetns names this process's network namespace netnsName. A name
// already there is another run's, or a killed one's: refused, with the
// command that removes it.
func attachNetns() error {
	if _, err := os.Stat(filepath.Join("/run/netns", netnsName)); err == nil {
		return fmt.Errorf("a network namespace named %q exists: another `make run NODE=real` is running, or one was killed (then `ip netns delete %s` removes it)", netnsName, netnsName)
	}
	if out, err := exec.Command("ip", "netns", "attach", netnsName, strconv.Itoa(os.Getpid())).CombinedOutput(); err != nil {
		return fmt.Errorf("ip netns attach %s: %w: %s", netnsName, err, out)
	}
	return nil
}

// detachNetns removes the name; the namespace ends with the run's last
// process.
func detachNetns() error {
	if out, err := exec.Command("ip", "netns", "delete", netnsName).CombinedOutput(); err != nil {
		return fmt.Errorf("ip netns delete %s: %w: %s", netnsName, err, out)
	}
	return nil
}

// podNetns are the pods' network namespaces that containerd's CRI has
// mounted under /run/netns (cni-…): the node's Stop kills the pods'
// processes and containerd without tearing their sandboxes down, which
// would remove them.
func podNetns() map[string]bool {
	entries, _ := os.ReadDir("/run/netns")
	out := map[string]bool{}
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), "cni-") {
			out[e.Name()] = true
		}
	}
	return out
}

// removePodNetns unmounts and removes the pods' network namespaces that
// were not there before the run (before), as `ip netns delete` does.
func removePodNetns(before map[string]bool) error {
	var errs []error
	for name := range podNetns() {
		if before[name] {
			continue
		}
		p := filepath.Join("/run/netns", name)
		if err := syscall.Unmount(p, syscall.MNT_DETACH); err != nil && !errors.Is(err, syscall.EINVAL) {
			errs = append(errs, fmt.Errorf("unmounting %s: %w", p, err))
			continue
		}
		if err := os.Remove(p); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
