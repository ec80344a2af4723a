package reconciler

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
)

// When the ledger began is recorded once, by the first start, and never
// moved by a later one: a later start must not let the Deployments created
// since adopt annotations.
func TestLedgerSince(t *testing.T) {
	ctx := context.Background()
	first := t0.Add(time.Hour)
	scheme := runtime.NewScheme()
	require.NoError(t, clientgoscheme.AddToScheme(scheme))
	record := func(v string) *corev1.ConfigMap {
		return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "deployguard", Name: LedgerSinceConfigMap}, Data: map[string]string{"since": v}}
	}
	tests := []struct {
		name    string
		objs    []client.Object
		funcs   interceptor.Funcs
		want    time.Time
		wantErr string
	}{
		{name: "first start: now", want: first},
		{name: "a later start: the first's", objs: []client.Object{record(t0.Format(time.RFC3339))}, want: t0},
		{name: "another replica created it first: theirs", want: t0, funcs: interceptor.Funcs{
			Create: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
				require.NoError(t, c.Create(ctx, record(t0.Format(time.RFC3339))))
				return c.Create(ctx, obj, opts...)
			},
		}},
		{name: "not a time: an error, not a new start", objs: []client.Object{record("yesterday")}, wantErr: `"yesterday" is not an RFC 3339 time`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(tt.objs...).WithInterceptorFuncs(tt.funcs).Build()
			got, err := LedgerSince(ctx, c, "deployguard", first)
			if tt.wantErr != "" {
				assert.ErrorContains(t, err, tt.wantErr)
				return
			}
			require.NoError(t, err)
			assert.True(t, tt.want.Equal(got), "got %s, want %s", got, tt.want)

			again, err := LedgerSince(ctx, c, "deployguard", first.Add(24*time.Hour))
			require.NoError(t, err)
			assert.True(t, got.Equal(again), "a later start keeps it")
		})
	}
}
