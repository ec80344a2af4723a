// Package faults proves on a full local cluster (real kube-apiserver,
// kube-controller-manager, kube-scheduler, kwok nodes) that guard replicas
// behind a load balancer can be killed and upgraded under admission load: HAProxy
// plays the Service, health-checking each replica's /readyz, and the webhook
// configurations point at it. Needs haproxy on PATH (`make test-faults`
// installs Debian's package).
package faults

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/go-logr/logr"
	"github.com/stretchr/testify/require"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/deployguard/deployguard/test/harness"
)

var tools, guardBin string

func TestMain(m *testing.M) {
	// The API server relays the mutating webhook's warning (selector
	// defaulted) with nine requests in ten: the load's client drops them.
	ctrl.SetLogger(logr.Discard())
	var err error
	if tools, err = harness.ToolsDir(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	if guardBin, err = harness.GuardBinary(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	os.Exit(m.Run())
}

// workDir is a folder for the test's cluster, guards and logs, kept (and the
// log's end printed) when the test fails.
func workDir(t *testing.T) (string, *os.File) {
	t.Helper()
	dir, err := os.MkdirTemp("", "deployguard-faults-")
	require.NoError(t, err)
	log, err := os.Create(filepath.Join(dir, "test.log"))
	require.NoError(t, err)
	t.Cleanup(func() {
		log.Close()
		if t.Failed() {
			b, _ := os.ReadFile(log.Name())
			if len(b) > 15000 {
				b = b[len(b)-15000:]
			}
			t.Logf("work folder kept: %s\n--- end of %s ---\n%s", dir, log.Name(), b)
			return
		}
		os.RemoveAll(dir)
	})
	return dir, log
}
