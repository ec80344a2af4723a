// Package upstreame2e is Kubernetes' own end-to-end suite cut down to the specs
// the upstream compatibility tier runs (test/upstream): sig-apps (Deployment,
// ReplicaSet) and sig-api-machinery (admission policies, garbage collector,
// server-side apply, field validation). It is built with `go test -c` from the
// same k8s.io/kubernetes module as the control plane, so spec and cluster are
// the same version.
//
// It follows upstream's test/e2e/e2e_test.go and e2e.go (RunE2ETests) and keeps
// only what a cluster without a cloud provider needs: no provider packages, no
// image pre-pulling, no log or metrics gathering, no embedded manifests (none
// of these specs read test files).
package upstreame2e

import (
	"context"
	"flag"
	"fmt"
	"os"
	"testing"

	"github.com/onsi/ginkgo/v2"
	"github.com/onsi/gomega"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/component-base/logs"
	"k8s.io/klog/v2"
	"k8s.io/kubernetes/test/e2e/framework"
	"k8s.io/kubernetes/test/e2e/framework/config"
	e2enode "k8s.io/kubernetes/test/e2e/framework/node"
	utilnet "k8s.io/utils/net"

	// The logging flags (-v, …) on the command line, as upstream has them.
	_ "k8s.io/component-base/logs/testinit"

	// Defines and freezes the feature labels the specs use.
	_ "k8s.io/kubernetes/test/e2e/feature"

	// The specs.
	_ "k8s.io/kubernetes/test/e2e/apimachinery"
	_ "k8s.io/kubernetes/test/e2e/apps"

	// Framework extensions upstream registers: namespace dumps on failure,
	// metrics hooks (off unless asked for by flag), and the check after each
	// spec that every node is still Ready.
	_ "k8s.io/kubernetes/test/e2e/framework/debug/init"
	_ "k8s.io/kubernetes/test/e2e/framework/metrics/init"
	_ "k8s.io/kubernetes/test/e2e/framework/node/init"
	_ "k8s.io/kubernetes/test/utils/ktesting/format"
)

func TestMain(m *testing.M) {
	config.CopyFlags(config.Flags, flag.CommandLine)
	framework.RegisterCommonFlags(flag.CommandLine)
	framework.RegisterClusterFlags(flag.CommandLine)
	flag.Parse()
	if flag.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "unknown additional command line arguments: %s\n", flag.Args())
		os.Exit(2)
	}
	framework.AfterReadingAllFlags(&framework.TestContext)
	os.Exit(m.Run())
}

func TestE2E(t *testing.T) {
	// As upstream's RunE2ETests: InitLogs turns contextual logging off, the
	// suite wants it on.
	logs.InitLogs()
	defer logs.FlushLogs()
	klog.EnableContextualLogging(true)

	gomega.RegisterFailHandler(framework.Fail)
	suiteConfig, reporterConfig := framework.CreateGinkgoConfig()
	ginkgo.RunSpecs(t, "Kubernetes e2e suite (upstream tier)", suiteConfig, reporterConfig)
}

// The part of upstream's setupSuite that applies to a cluster without cloud or
// system pods: every node schedulable and the node count known before a spec
// runs; and setupSuitePerGinkgoNode's IP family, which specs may read.
var _ = ginkgo.SynchronizedBeforeSuite(func(ctx context.Context) []byte {
	c, err := framework.LoadClientset()
	framework.ExpectNoError(err, "loading the client")
	timeouts := framework.NewTimeoutContext()
	framework.ExpectNoError(e2enode.WaitForAllNodesSchedulable(ctx, c, timeouts.NodeSchedulable))
	if framework.TestContext.CloudConfig.NumNodes == framework.DefaultNumNodes {
		nodes, err := e2enode.GetReadySchedulableNodes(ctx, c)
		framework.ExpectNoError(err)
		framework.TestContext.CloudConfig.NumNodes = len(nodes.Items)
	}
	if v, err := c.Discovery().ServerVersion(); err == nil {
		framework.Logf("kube-apiserver version: %s", v.GitVersion)
	}
	return nil
}, func(ctx context.Context, _ []byte) {
	c, err := framework.LoadClientset()
	framework.ExpectNoError(err, "loading the client")
	svc, err := c.CoreV1().Services(metav1.NamespaceDefault).Get(ctx, "kubernetes", metav1.GetOptions{})
	framework.ExpectNoError(err, "reading the kubernetes Service for the cluster's IP family")
	framework.TestContext.IPFamily = "ipv4"
	if utilnet.IsIPv6String(svc.Spec.ClusterIP) {
		framework.TestContext.IPFamily = "ipv6"
	}
})
