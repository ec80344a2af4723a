package clients

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/deployguard/deployguard/test/harness"
)

// kubectl's flags for reaching a cluster (--kubeconfig, --context, -n, --as)
// mean to `kubectl deployguard` what they mean to kubectl itself: the same
// command line reaches the same cluster, namespace and identity, or fails
// the same way.
func TestPluginTakesKubectlsClusterFlags(t *testing.T) {
	ns := harness.NewNamespace(t, local.Client)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	require.NoError(t, local.Client.Create(ctx, harness.Deployment(ns, "flags-web", "app:1")))

	// A kubeconfig whose current context reaches nothing, and a context
	// "here" that reaches the cluster, with the test's namespace as its own.
	admin, err := clientcmd.LoadFromFile(local.Cluster.Kubeconfig)
	require.NoError(t, err)
	here := *admin.Contexts[admin.CurrentContext]
	here.Namespace = ns
	admin.Contexts["here"] = &here
	admin.Clusters["nowhere"] = &clientcmdapi.Cluster{Server: "https://127.0.0.1:1"}
	admin.Contexts["nowhere"] = &clientcmdapi.Context{Cluster: "nowhere", AuthInfo: here.AuthInfo}
	admin.CurrentContext = "nowhere"
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	require.NoError(t, clientcmd.WriteToFile(*admin, kubeconfig))

	status := func(args ...string) result {
		return kubectl(ctx, append([]string{"deployguard", "status", "flags-web"}, args...)...)
	}
	get := func(args ...string) result {
		return kubectl(ctx, append([]string{"get", "deployment", "flags-web"}, args...)...)
	}

	// --kubeconfig and --context: the context's cluster and namespace.
	r := status("--kubeconfig", kubeconfig, "--context", "here")
	assert.Equal(t, 0, r.Code, "%s", r)
	assert.Contains(t, r.Stdout, "Deployment "+ns+"/flags-web:")
	require.Equal(t, 0, get("--kubeconfig", kubeconfig, "--context", "here").Code, "kubectl itself reads the file so")

	// The file's current context, which reaches nothing: both fail, and say where they went.
	r = status("--kubeconfig", kubeconfig, "-n", ns)
	assert.Equal(t, 1, r.Code, "%s", r)
	assert.Contains(t, r.Stderr, "127.0.0.1:1")
	assert.NotEqual(t, 0, get("--kubeconfig", kubeconfig, "-n", ns).Code, "kubectl fails too")

	// -n over the context's namespace.
	r = status("--kubeconfig", kubeconfig, "--context", "here", "-n", "default")
	assert.Equal(t, 0, r.Code, "%s", r)
	assert.Contains(t, r.Stdout, "Deployment default/flags-web does not exist.")

	// --as: an identity with no rights is refused as kubectl is, in the API server's words.
	const nobody = "system:serviceaccount:default:nobody"
	r = status("-n", ns, "--as", nobody)
	assert.Equal(t, 1, r.Code, "%s", r)
	assert.Contains(t, r.Stderr, `User "`+nobody+`" cannot get resource "deployments"`)
	assert.Contains(t, get("-n", ns, "--as", nobody).Stderr, `User "`+nobody+`" cannot get resource "deployments"`)
}
