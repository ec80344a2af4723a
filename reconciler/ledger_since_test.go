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
// since adopt annotations. Adoption happens only when a person asked for a
// takeover (LedgerAdoptKey): a guard installed again, or on a cluster that
// never ran an earlier release, takes no annotation a tenant wrote as its
// state.
func TestLedgerSince(t *testing.T) {
	ctx := context.Background()
	first := t0.Add(time.Hour)
	scheme := runtime.NewScheme()
	require.NoError(t, clientgoscheme.AddToScheme(scheme))
	record := func(data map[string]string) *corev1.ConfigMap {
		return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "deployguard", Name: LedgerSinceConfigMap}, Data: data}
	}
	since := t0.Format(time.RFC3339)
	tests := []struct {
		name  string
		objs  []client.Object
		funcs interceptor.Funcs
		// want is what adopts; wantSince what is recorded.
		want, wantSince time.Time
		wantErr         string
	}{
		{name: "first start, nobody asked for a takeover: records now, adopts nothing", wantSince: first},
		{name: "a later start: the first's time, still nothing", objs: []client.Object{record(map[string]string{"since": since})}, wantSince: t0},
		{name: "a takeover asked for before the first start: now, and adopts", objs: []client.Object{record(map[string]string{LedgerAdoptKey: "true"})},
			want: first, wantSince: first},
		{name: "a later start of a takeover: the first's time", objs: []client.Object{record(map[string]string{"since": since, LedgerAdoptKey: "true"})},
			want: t0, wantSince: t0},
		{name: "anything but true adopts nothing", objs: []client.Object{record(map[string]string{"since": since, LedgerAdoptKey: "yes"})}, wantSince: t0},
		{name: "another replica created it first: theirs", wantSince: t0, funcs: interceptor.Funcs{
			Create: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
				require.NoError(t, c.Create(ctx, record(map[string]string{"since": since})))
				return c.Create(ctx, obj, opts...)
			},
		}},
		{name: "another replica filled in the takeover's time first: theirs", objs: []client.Object{record(map[string]string{LedgerAdoptKey: "true"})},
			want: t0, wantSince: t0, funcs: interceptor.Funcs{
				Update: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.UpdateOption) error {
					theirs := &corev1.ConfigMap{}
					require.NoError(t, c.Get(ctx, client.ObjectKeyFromObject(obj), theirs))
					theirs.Data["since"] = since
					require.NoError(t, c.Update(ctx, theirs))
					return c.Update(ctx, obj, opts...)
				},
			}},
		{name: "not a time: an error, not a new start", objs: []client.Object{record(map[string]string{"since": "yesterday"})}, wantErr: `"yesterday" is not an RFC 3339 time`},
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
			cm := &corev1.ConfigMap{}
			require.NoError(t, c.Get(ctx, client.ObjectKey{Namespace: "deployguard", Name: LedgerSinceConfigMap}, cm))
			assert.Equal(t, tt.wantSince.UTC().Format(time.RFC3339), cm.Data["since"])

			again, err := LedgerSince(ctx, c, "deployguard", first.Add(24*time.Hour))
			require.NoError(t, err)
			assert.True(t, got.Equal(again), "a later start keeps it")
		})
	}
}
