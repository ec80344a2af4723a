package reconciler

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deployguard/deployguard/reconciler/vocab"
)

func recordConfigMap(ns, name string, expires time.Time) *corev1.ConfigMap {
	return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{
		Namespace: ns, Name: name,
		Labels:      map[string]string{vocab.LabelRecord: "true"},
		Annotations: map[string]string{vocab.AnnotationRecordExpires: expires.UTC().Format(time.RFC3339)},
	}}
}

func TestRecordSweeper(t *testing.T) {
	now := t0.Add(20 * time.Minute)
	unreadable := recordConfigMap(guardNamespace, "deployguard-record-shop.odd", now)
	unreadable.Annotations[vocab.AnnotationRecordExpires] = "soon"
	notRecord := recordConfigMap(guardNamespace, "app-config", now.Add(-time.Hour))
	notRecord.Labels = nil
	e := newEnv(t,
		recordConfigMap(guardNamespace, "deployguard-record-shop.old", now.Add(-time.Hour)),
		recordConfigMap(guardNamespace, "deployguard-record-blog.due", now),
		recordConfigMap(guardNamespace, "deployguard-record-shop.soon", now.Add(3*time.Minute)),
		recordConfigMap(guardNamespace, "deployguard-record-blog.later", now.Add(48*time.Hour)),
		unreadable, notRecord,
		// Labelled as records in a tenant's namespace (by the tenant, or an
		// earlier release): not the guard's, neither deleted nor waited for.
		recordConfigMap("shop", "deployguard-record-web", now.Add(-time.Hour)),
		recordConfigMap("shop", "deployguard-record-api", now.Add(time.Minute)),
	)
	s := &RecordSweeper{Namespace: guardNamespace, Reader: e.client, Client: e.r.Client, Clock: clocktesting.NewFakeClock(now), Interval: 10 * time.Minute, Metrics: e.r.Metrics}

	wait, err := s.Sweep(context.Background())
	require.NoError(t, err)

	assert.Equal(t, 3*time.Minute, wait, "wakes at the next expiry of its own records, before the interval")
	assert.ElementsMatch(t, []string{"delete ConfigMap deployguard-record-shop.old", "delete ConfigMap deployguard-record-blog.due"}, e.writes)
	var left corev1.ConfigMapList
	require.NoError(t, e.client.List(context.Background(), &left))
	var names []string
	for _, cm := range left.Items {
		names = append(names, cm.Namespace+"/"+cm.Name)
	}
	assert.ElementsMatch(t, []string{
		guardNamespace + "/deployguard-record-shop.soon", guardNamespace + "/deployguard-record-blog.later",
		guardNamespace + "/deployguard-record-shop.odd", guardNamespace + "/app-config",
		"shop/deployguard-record-web", "shop/deployguard-record-api",
	}, names, "records not yet due, records without a readable expiry, other ConfigMaps and ConfigMaps outside the guard's namespace are kept")
	assert.Equal(t, 2.0, counterValue(t, e.r.Metrics.recordsExpired))

	e.writes = nil
	wait, err = s.Sweep(context.Background())
	require.NoError(t, err)
	assert.Empty(t, e.writes, "nothing deleted twice")
	assert.Equal(t, 3*time.Minute, wait)
}

func TestRecordSweeperWaits(t *testing.T) {
	now := t0.Add(300 * time.Millisecond)
	tests := []struct {
		name string
		objs []client.Object
		want time.Duration
	}{
		{name: "no records: the interval", want: 10 * time.Minute},
		{name: "next expiry after the interval", objs: []client.Object{recordConfigMap(guardNamespace, "a", t0.Add(time.Hour))}, want: 10 * time.Minute},
		{name: "never spins on an expiry just passed", objs: []client.Object{recordConfigMap(guardNamespace, "a", t0.Add(time.Second))}, want: minSweepWait},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t, tt.objs...)
			s := &RecordSweeper{Namespace: guardNamespace, Reader: e.client, Client: e.r.Client, Clock: clocktesting.NewFakeClock(now), Interval: 10 * time.Minute, Metrics: e.r.Metrics}
			wait, err := s.Sweep(context.Background())
			require.NoError(t, err)
			assert.Equal(t, tt.want, wait)
		})
	}
}

// A sweeper without a namespace deletes nothing, anywhere.
func TestRecordSweeperWithoutNamespace(t *testing.T) {
	e := newEnv(t, recordConfigMap("shop", "deployguard-record-web", t0))
	s := &RecordSweeper{Reader: e.client, Client: e.r.Client, Clock: clocktesting.NewFakeClock(t0.Add(time.Hour)), Interval: 10 * time.Minute, Metrics: e.r.Metrics}
	_, err := s.Sweep(context.Background())
	assert.ErrorContains(t, err, "no namespace")
	assert.Empty(t, e.writes)
}

func TestRecordSweepInterval(t *testing.T) {
	assert.Equal(t, DefaultRecordSweepInterval, Options{}.recordSweepInterval())
	assert.Equal(t, time.Minute, Options{RecordRetention: time.Minute}.recordSweepInterval(), "never longer than the retention")
	assert.Equal(t, 30*time.Second, Options{RecordSweepInterval: 30 * time.Second}.recordSweepInterval())
}
