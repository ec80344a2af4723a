package reconciler

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestWithoutTemplateOwnership(t *testing.T) {
	entry := func(manager string, op metav1.ManagedFieldsOperationType, sub, fields string) metav1.ManagedFieldsEntry {
		return metav1.ManagedFieldsEntry{Manager: manager, Operation: op, Subresource: sub, FieldsType: "FieldsV1", FieldsV1: metav1.NewFieldsV1(fields)}
	}
	const (
		template    = `{"f:spec":{"f:template":{"f:spec":{"f:containers":{"k:{\"name\":\"web\"}":{"f:image":{}}}}}}}`
		annotations = `{"f:metadata":{"f:annotations":{"f:deployguard.io/rolled-back-to":{}}}}`
		both        = `{"f:metadata":{"f:annotations":{"f:deployguard.io/rolled-back-to":{}}},"f:spec":{"f:template":{"f:spec":{"f:containers":{"k:{\"name\":\"web\"}":{"f:image":{}}}}}}}`
	)
	helm := entry("helm", metav1.ManagedFieldsOperationApply, "", template)
	tests := []struct {
		name        string
		in          []metav1.ManagedFieldsEntry
		want        []metav1.ManagedFieldsEntry
		wantChanged bool
	}{
		{name: "the guard's claim on the template goes, its annotations stay",
			in:          []metav1.ManagedFieldsEntry{helm, entry(FieldManager, metav1.ManagedFieldsOperationUpdate, "", both)},
			want:        []metav1.ManagedFieldsEntry{helm, entry(FieldManager, metav1.ManagedFieldsOperationUpdate, "", annotations)},
			wantChanged: true},
		{name: "an entry left with nothing goes",
			in:          []metav1.ManagedFieldsEntry{helm, entry(FieldManager, metav1.ManagedFieldsOperationUpdate, "", template)},
			want:        []metav1.ManagedFieldsEntry{helm},
			wantChanged: true},
		{name: "other managers, status and applies are left alone",
			in: []metav1.ManagedFieldsEntry{helm, entry("kubectl-rollout", metav1.ManagedFieldsOperationUpdate, "", template),
				entry(FieldManager, metav1.ManagedFieldsOperationUpdate, "status", `{"f:status":{}}`), entry(FieldManager, metav1.ManagedFieldsOperationApply, "", template)},
			want: []metav1.ManagedFieldsEntry{helm, entry("kubectl-rollout", metav1.ManagedFieldsOperationUpdate, "", template),
				entry(FieldManager, metav1.ManagedFieldsOperationUpdate, "status", `{"f:status":{}}`), entry(FieldManager, metav1.ManagedFieldsOperationApply, "", template)}},
		{name: "no template claim: nothing to do",
			in:   []metav1.ManagedFieldsEntry{entry(FieldManager, metav1.ManagedFieldsOperationUpdate, "", annotations)},
			want: []metav1.ManagedFieldsEntry{entry(FieldManager, metav1.ManagedFieldsOperationUpdate, "", annotations)}},
		{name: "an entry it cannot read is kept",
			in:   []metav1.ManagedFieldsEntry{entry(FieldManager, metav1.ManagedFieldsOperationUpdate, "", `not json`)},
			want: []metav1.ManagedFieldsEntry{entry(FieldManager, metav1.ManagedFieldsOperationUpdate, "", `not json`)}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, changed := WithoutTemplateOwnership(tt.in, FieldManager)
			assert.Equal(t, tt.wantChanged, changed)
			assert.Equal(t, len(tt.want), len(got))
			for i := range tt.want {
				if i < len(got) {
					assert.Equal(t, tt.want[i].Manager, got[i].Manager)
					if json.Valid(tt.want[i].FieldsV1.GetRawBytes()) {
						assert.JSONEq(t, string(tt.want[i].FieldsV1.GetRawBytes()), string(got[i].FieldsV1.GetRawBytes()), "entry %d", i)
					} else {
						assert.Equal(t, tt.want[i].FieldsV1.GetRawBytes(), got[i].FieldsV1.GetRawBytes(), "entry %d", i)
					}
				}
			}
		})
	}
}
