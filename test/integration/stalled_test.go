package integration

import (
	"context"
	"crypto/tls"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deployguard/deployguard/reconciler/vocab"
	"github.com/deployguard/deployguard/test/harness"
	guardwebhook "github.com/deployguard/deployguard/webhook"
)

// TestStalledClientsDoNotStopAdmission: clients that reach the webhook port,
// send a review's headers and then stop (broken, or meaning harm) neither
// stop the API server's calls in the meantime nor stay open: each is
// answered with an error and its connection closed once the body timeout
// passes. Through controller-runtime's webhook server, as serve runs it.
func TestStalledClientsDoNotStopAdmission(t *testing.T) {
	ctx := context.Background()
	o := &testEnv.WebhookInstallOptions
	addr := net.JoinHostPort(o.LocalServingHost, strconv.Itoa(o.LocalServingPort))

	const stalledClients = 50
	var conns []*tls.Conn
	for range stalledClients {
		conn, err := harness.StallRequest(addr, guardwebhook.MutatePath)
		require.NoError(t, err)
		defer conn.Close()
		conns = append(conns, conn)
	}
	sent := time.Now()

	// Meanwhile the API server's calls are answered, before any stalled
	// request has timed out: the guard's mutating webhook marks what it
	// defaulted (the native selector repair alone would not).
	ns := harness.NewNamespace(t, k8s, kept)
	d := harness.Deployment(ns, "shop", appImage, func(d *appsv1.Deployment) {
		d.Spec.Selector = nil
		d.Spec.Template.Labels = map[string]string{"app.kubernetes.io/name": "shop"}
	})
	require.NoError(t, k8s.Create(ctx, d))
	answered := time.Since(sent)
	got := &appsv1.Deployment{}
	require.NoError(t, k8s.Get(ctx, client.ObjectKeyFromObject(d), got))
	assert.Equal(t, map[string]string{"app.kubernetes.io/name": "shop"}, got.Spec.Selector.MatchLabels)
	assert.Equal(t, "spec.selector", got.Annotations[vocab.AnnotationDefaulted], "the guard's webhook answered")
	assert.Less(t, answered, suiteBodyTimeout, "the create waited for the stalled requests to time out")

	// Every stalled request is answered with an error, and its connection
	// closed, soon after the timeout. The read deadline only stops the test
	// from hanging.
	for i, conn := range conns {
		rest, err := harness.ReadUntilClosed(conn, sent.Add(suiteBodyTimeout+20*time.Second))
		require.NoError(t, err, "stalled client %d", i)
		assert.Contains(t, rest, "Connection: close", "stalled client %d", i)
		assert.Contains(t, rest, "i/o timeout", "stalled client %d", i)
	}
}
