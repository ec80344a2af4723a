package reconciler

import (
	"maps"
	"testing"

	"github.com/stretchr/testify/assert"
	appsv1 "k8s.io/api/apps/v1"

	"github.com/deployguard/deployguard/reconciler/vocab"
)

func TestAddQuarantined(t *testing.T) {
	tests := []struct {
		name  string
		list  []string
		hash  string
		limit int
		want  []string
	}{
		{name: "first", list: nil, hash: "a", limit: 3, want: []string{"a"}},
		{name: "appended as newest", list: []string{"a", "b"}, hash: "c", limit: 3, want: []string{"a", "b", "c"}},
		{name: "oldest falls off", list: []string{"a", "b", "c"}, hash: "d", limit: 3, want: []string{"b", "c", "d"}},
		{name: "already there: moved to newest, not doubled", list: []string{"a", "b", "c"}, hash: "a", limit: 3, want: []string{"b", "c", "a"}},
		{name: "no limit given: the default", list: []string{"1", "2", "3", "4", "5", "6", "7", "8", "9", "10"}, hash: "11", limit: 0,
			want: []string{"2", "3", "4", "5", "6", "7", "8", "9", "10", "11"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := append([]string(nil), tt.list...)
			assert.Equal(t, tt.want, AddQuarantined(tt.list, tt.hash, tt.limit))
			assert.Equal(t, before, tt.list, "input not modified")
		})
	}
}

func TestRemoveQuarantined(t *testing.T) {
	list := []string{"a", "b", "c"}
	assert.Equal(t, []string{"a", "c"}, RemoveQuarantined(list, "b"))
	assert.Equal(t, []string{"a", "b", "c"}, RemoveQuarantined(list, "x"))
	assert.Equal(t, []string{"a", "b", "c"}, list, "input not modified")
}

func TestQuarantineListRoundTrip(t *testing.T) {
	d := deployment(func(d *appsv1.Deployment) {
		d.Annotations[vocab.AnnotationQuarantinedTemplates] = " a,, b ,c,"
	})
	got := vocab.QuarantinedTemplates(d)
	assert.Equal(t, []string{"a", "b", "c"}, got)
	assert.Equal(t, "a,b,c", FormatTemplateList(got))
	assert.Nil(t, vocab.QuarantinedTemplates(deployment()))
}

func TestAlignQuarantineLabel(t *testing.T) {
	labelled := map[string]string{"app": "web", vocab.LabelQuarantined: vocab.LabelQuarantinedValue}
	tests := []struct {
		name        string
		list        string // the quarantine annotation; "-" none
		labels      map[string]string
		wantChanged bool
		wantLabel   bool
	}{
		{name: "quarantined, labelled", list: "a,b", labels: labelled, wantLabel: true},
		{name: "quarantined by an earlier release: labelled", list: "a", labels: map[string]string{"app": "web"}, wantChanged: true, wantLabel: true},
		{name: "quarantined, no labels at all", list: "a", wantChanged: true, wantLabel: true},
		{name: "label with another value: set back", list: "a", labels: map[string]string{vocab.LabelQuarantined: "no"}, wantChanged: true, wantLabel: true},
		{name: "released: the label goes", list: "-", labels: labelled, wantChanged: true},
		{name: "an empty list is none", list: " , ", labels: labelled, wantChanged: true},
		{name: "never quarantined", list: "-", labels: map[string]string{"app": "web"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := &appsv1.Deployment{}
			if tt.labels != nil {
				d.Labels = maps.Clone(tt.labels)
			}
			if tt.list != "-" {
				d.Annotations = map[string]string{vocab.AnnotationQuarantinedTemplates: tt.list}
			}
			assert.Equal(t, tt.wantChanged, AlignQuarantineLabel(d))
			_, has := d.Labels[vocab.LabelQuarantined]
			assert.Equal(t, tt.wantLabel, has)
			if tt.wantLabel {
				assert.Equal(t, vocab.LabelQuarantinedValue, d.Labels[vocab.LabelQuarantined])
			}
			assert.Equal(t, tt.labels["app"], d.Labels["app"], "other labels kept")
			assert.False(t, AlignQuarantineLabel(d), "a second run changes nothing")
		})
	}
}
