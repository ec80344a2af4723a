package serve

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	"github.com/deployguard/deployguard/cmd/deployguard/config"
	"github.com/deployguard/deployguard/cmd/deployguard/health"
	"github.com/deployguard/deployguard/cmd/deployguard/leader"
	"github.com/deployguard/deployguard/policy"
	"github.com/deployguard/deployguard/webhook/audit"
	"github.com/deployguard/deployguard/webhook/review"
)

// setupManager is what setupAudit and a term's setup read of a manager;
// it records what they add. Nothing here contacts a cluster.
type setupManager struct {
	ctrl.Manager
	added []manager.Runnable
}

func (m *setupManager) GetConfig() *rest.Config        { return &rest.Config{Host: "https://127.0.0.1:1"} }
func (m *setupManager) GetScheme() *runtime.Scheme     { return runtime.NewScheme() }
func (m *setupManager) GetRESTMapper() meta.RESTMapper { return meta.NewDefaultRESTMapper(nil) }
func (m *setupManager) GetClient() client.Client       { return fake.NewClientBuilder().Build() }
func (m *setupManager) GetCache() cache.Cache          { return nil }
func (m *setupManager) GetAPIReader() client.Reader    { return m.GetClient() }
func (m *setupManager) Add(r manager.Runnable) error   { m.added = append(m.added, r); return nil }

// TestAuditAPIReaderOutlivesTerms: the audit's API reader (its own
// transport) is made once, in serve's setup, and every leader term's audit
// reads through it: a term does not leave a transport behind.
func TestAuditAPIReaderOutlivesTerms(t *testing.T) {
	eng, err := policy.New(policy.Options{})
	require.NoError(t, err)
	terms := &leader.Terms{}
	budgets := review.NewBudgetIndex(review.NewOverlapIndex(func() bool { return true }))
	require.NoError(t, setupAudit(&setupManager{}, &health.Probes{}, terms, config.Config{}, &review.Options{}, eng, budgets, nil, nil))
	require.Len(t, terms.Setup, 1)

	var readers []client.Reader
	for term := range 3 {
		lm := &setupManager{}
		require.NoError(t, terms.Setup[0](context.Background(), lm), "term %d", term)
		require.Len(t, lm.added, 1)
		r, ok := lm.added[0].(*audit.Runner)
		require.True(t, ok)
		require.NotNil(t, r.APIReader)
		readers = append(readers, r.APIReader)
	}
	for _, r := range readers[1:] {
		assert.Same(t, readers[0], r, "one reader for every term")
	}
}
