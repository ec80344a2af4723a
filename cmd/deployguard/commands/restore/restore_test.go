package restore

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/yaml"

	"github.com/deployguard/deployguard/cmd/deployguard/cli"
	"github.com/deployguard/deployguard/cmd/deployguard/commands/internal/fixtures"
	"github.com/deployguard/deployguard/reconciler"
	"github.com/deployguard/deployguard/reconciler/vocab"
)

const guardNS = "deployguard-system"

func fakeClient(t *testing.T, objs ...client.Object) client.WithWatch {
	t.Helper()
	scheme := runtime.NewScheme()
	require.NoError(t, clientgoscheme.AddToScheme(scheme))
	return fake.NewClientBuilder().WithScheme(scheme).WithObjects(objs...).Build()
}

// record is the guard's record of d, in the guard's namespace.
func record(t *testing.T, d *appsv1.Deployment) *corev1.ConfigMap {
	t.Helper()
	cm, err := reconciler.BuildRecord(d, nil, guardNS, time.Date(2026, 4, 1, 0, 0, 0, 0, time.UTC))
	require.NoError(t, err)
	return cm
}

// tenantRecord is a ConfigMap labelled as a record in the Deployment's own
// namespace, by the name an earlier release gave its records there: written
// by that release, or forged by anyone who may write ConfigMaps there.
func tenantRecord(t *testing.T, d *appsv1.Deployment) *corev1.ConfigMap {
	t.Helper()
	manifest, err := yaml.Marshal(reconciler.RestorableDeployment(d))
	require.NoError(t, err)
	return &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: d.Namespace, Name: reconciler.LegacyRecordName(d.Name),
			Labels:      map[string]string{vocab.LabelRecord: "true"},
			Annotations: map[string]string{vocab.AnnotationRecordOf: d.Name, vocab.AnnotationRecordUID: string(d.UID)},
		},
		Data: map[string]string{reconciler.RecordKeyDeployment: string(manifest)},
	}
}

func opts() options {
	return options{guardNamespace: guardNS, namespace: "shop", name: "web"}
}

func TestRestoreDeployment(t *testing.T) {
	deleted := fixtures.Drained("web", "web:v4")
	c := fakeClient(t, record(t, deleted))
	var out, warn bytes.Buffer

	require.NoError(t, restoreDeployment(context.Background(), c, opts(), &out, &warn))

	got := &appsv1.Deployment{}
	require.NoError(t, c.Get(context.Background(), client.ObjectKey{Namespace: "shop", Name: "web"}, got))
	assert.Equal(t, deleted.Spec.Template, got.Spec.Template)
	assert.Equal(t, int32(3), *got.Spec.Replicas, "the replicas from before the drain")
	assert.Empty(t, got.Finalizers, "the mutating webhook adds them again")
	assert.NotContains(t, got.Annotations, vocab.AnnotationDrainReplicas)
	assert.Contains(t, out.String(), "deployment.apps/web restored in namespace shop from record deployguard-system/deployguard-record-shop.web (3 replicas")
	assert.Contains(t, out.String(), "kept until 2026-04-01T00:00:00Z")
	assert.Empty(t, warn.String())
	err := c.Get(context.Background(), client.ObjectKey{Namespace: guardNS, Name: "web"}, &appsv1.Deployment{})
	assert.Error(t, err, "recreated in its own namespace, not the record's")
}

func TestRestoreRefuses(t *testing.T) {
	live := fixtures.Drained("web", "web:v5")
	live.Finalizers = nil
	beingDeleted := fixtures.Drained("web", "web:v5")
	beingDeleted.DeletionTimestamp = &metav1.Time{Time: time.Now()}
	ofBlog := fixtures.Drained("web", "web:v4")
	ofBlog.Namespace = "blog"
	otherRecord := record(t, ofBlog)
	otherRecord.Name = reconciler.RecordName("shop", "web")
	tests := []struct {
		name      string
		objs      []client.Object
		knownGood bool
		want      string
	}{
		{name: "no record", want: "no record of Deployment shop/web (no ConfigMap deployguard-record-shop.web in namespace deployguard-system)"},
		{name: "the Deployment exists", objs: []client.Object{record(t, fixtures.Drained("web", "web:v4")), live},
			want: "deployment shop/web exists; restore never overwrites a Deployment"},
		{name: "the Deployment is still being deleted", objs: []client.Object{record(t, fixtures.Drained("web", "web:v4")), beingDeleted},
			want: "still being deleted"},
		{name: "no known-good template", objs: []client.Object{record(t, fixtures.Drained("web", "web:v4"))}, knownGood: true,
			want: "no known-good template"},
		{name: "not a record", objs: []client.Object{&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: guardNS, Name: "deployguard-record-shop.web"}}},
			want: "not a deployguard record"},
		{name: "the record of another Deployment", objs: []client.Object{otherRecord},
			want: `is the record of Deployment "blog/web"`},
		{name: "a record in the Deployment's namespace, without --legacy-record", objs: []client.Object{tenantRecord(t, fixtures.Drained("web", "web:v4"))},
			want: "Namespace shop holds ConfigMap deployguard-record-web labelled as a record"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := fakeClient(t, tt.objs...)
			var out, warn bytes.Buffer
			o := opts()
			o.knownGood = tt.knownGood
			err := restoreDeployment(context.Background(), c, o, &out, &warn)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tt.want)
			assert.Empty(t, out.String())
			d := &appsv1.Deployment{}
			if err := c.Get(context.Background(), client.ObjectKey{Namespace: "shop", Name: "web"}, d); err == nil {
				assert.Equal(t, "web:v5", d.Spec.Template.Spec.Containers[0].Image, "the existing Deployment is untouched")
			}
		})
	}
}

// A ConfigMap labelled as a record in a tenant's namespace decides nothing
// without --legacy-record: restore reads the guard's record, or none.
func TestRestoreIgnoresRecordsInTheDeploymentsNamespace(t *testing.T) {
	forged := fixtures.Drained("web", "attacker:latest")
	forged.Spec.Template.Spec.HostNetwork = true

	t.Run("beside the guard's record", func(t *testing.T) {
		c := fakeClient(t, tenantRecord(t, forged), record(t, fixtures.Drained("web", "web:v4")))
		var out, warn bytes.Buffer
		require.NoError(t, restoreDeployment(context.Background(), c, opts(), &out, &warn))
		got := &appsv1.Deployment{}
		require.NoError(t, c.Get(context.Background(), client.ObjectKey{Namespace: "shop", Name: "web"}, got))
		assert.Equal(t, "web:v4", got.Spec.Template.Spec.Containers[0].Image, "the guard's record, not the tenant's")
		assert.False(t, got.Spec.Template.Spec.HostNetwork)
		assert.Empty(t, warn.String())
	})
	t.Run("alone", func(t *testing.T) {
		c := fakeClient(t, tenantRecord(t, forged))
		var out, warn bytes.Buffer
		err := restoreDeployment(context.Background(), c, opts(), &out, &warn)
		require.Error(t, err)
		assert.Contains(t, err.Error(), "no record of Deployment shop/web")
		assert.Contains(t, err.Error(), "--legacy-record", "says how to read it, if it is what the caller wants")
		err = c.Get(context.Background(), client.ObjectKey{Namespace: "shop", Name: "web"}, &appsv1.Deployment{})
		assert.Error(t, err, "nothing created")
	})
}

// With --legacy-record, an earlier release's record in the Deployment's
// namespace is read when the guard's namespace holds none, with a warning.
func TestRestoreLegacyRecord(t *testing.T) {
	t.Run("read, with a warning", func(t *testing.T) {
		c := fakeClient(t, tenantRecord(t, fixtures.Drained("web", "web:v3")))
		var out, warn bytes.Buffer
		o := opts()
		o.legacyRecord = true
		require.NoError(t, restoreDeployment(context.Background(), c, o, &out, &warn))
		got := &appsv1.Deployment{}
		require.NoError(t, c.Get(context.Background(), client.ObjectKey{Namespace: "shop", Name: "web"}, got))
		assert.Equal(t, "web:v3", got.Spec.Template.Spec.Containers[0].Image)
		assert.Contains(t, warn.String(), "warning: restoring from ConfigMap shop/deployguard-record-web, an earlier release's record in the Deployment's own namespace")
		assert.Contains(t, warn.String(), "anyone who may write ConfigMaps in namespace shop")
		assert.Contains(t, out.String(), "from record shop/deployguard-record-web")
	})
	t.Run("the guard's record first", func(t *testing.T) {
		c := fakeClient(t, tenantRecord(t, fixtures.Drained("web", "web:v3")), record(t, fixtures.Drained("web", "web:v4")))
		var out, warn bytes.Buffer
		o := opts()
		o.legacyRecord = true
		require.NoError(t, restoreDeployment(context.Background(), c, o, &out, &warn))
		got := &appsv1.Deployment{}
		require.NoError(t, c.Get(context.Background(), client.ObjectKey{Namespace: "shop", Name: "web"}, got))
		assert.Equal(t, "web:v4", got.Spec.Template.Spec.Containers[0].Image)
		assert.Empty(t, warn.String())
	})
	t.Run("none anywhere", func(t *testing.T) {
		var out, warn bytes.Buffer
		o := opts()
		o.legacyRecord = true
		err := restoreDeployment(context.Background(), fakeClient(t), o, &out, &warn)
		require.Error(t, err)
		assert.Contains(t, err.Error(), "nor is there an earlier release's record (no ConfigMap deployguard-record-web in namespace shop)")
	})
	t.Run("the record of another Deployment", func(t *testing.T) {
		rec := tenantRecord(t, fixtures.Drained("web", "web:v3"))
		rec.Annotations[vocab.AnnotationRecordOf] = "api"
		var out, warn bytes.Buffer
		o := opts()
		o.legacyRecord = true
		err := restoreDeployment(context.Background(), fakeClient(t, rec), o, &out, &warn)
		require.Error(t, err)
		assert.Contains(t, err.Error(), `is not an earlier release's record of Deployment "web"`)
		assert.Empty(t, warn.String())
	})
}

// checkRecord refuses a ConfigMap outside the guard's namespace, whatever it
// says.
func TestCheckRecord(t *testing.T) {
	rec := record(t, fixtures.Drained("web", "web:v4"))
	key := client.ObjectKey{Namespace: "shop", Name: "web"}
	require.NoError(t, checkRecord(rec, guardNS, key))

	elsewhere := rec.DeepCopy()
	elsewhere.Namespace = "shop"
	assert.ErrorContains(t, checkRecord(elsewhere, guardNS, key), "is not in the guard's namespace deployguard-system")
	assert.ErrorContains(t, checkRecord(rec, guardNS, client.ObjectKey{Namespace: "blog", Name: "web"}), `is the record of Deployment "shop/web"`)
}

func TestRunUsage(t *testing.T) {
	run := func(args ...string) (int, string, string) {
		var out, errOut bytes.Buffer
		code := cli.ExitCode(NewCommand(cli.Streams{Out: &out, ErrOut: &errOut}), args, &errOut)
		return code, out.String(), errOut.String()
	}
	code, help, _ := run("-h")
	assert.Equal(t, 0, code)
	assert.Contains(t, help, "--legacy-record")
	assert.Contains(t, help, "guard's own namespace (--guard-namespace)")
	assert.Contains(t, help, "--context", "kubectl's flags")
	code, _, msg := run("shop/web", "--guard-namespace", "")
	assert.Equal(t, 2, code)
	assert.Contains(t, msg, "give a --guard-namespace")
	code, _, msg = run("shop/")
	assert.Equal(t, 2, code)
	assert.Contains(t, msg, "NAMESPACE/NAME")
}
