package policy

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestNewInputSameShape: the webhook passes raw JSON, the check command a
// typed Deployment or a map; policies must see the same document.
func TestNewInputSameShape(t *testing.T) {
	d := deployment(goodContainer("web"))
	typedWithMeta := d.DeepCopy()
	typedWithMeta.APIVersion, typedWithMeta.Kind = "apps/v1", "Deployment"
	raw, err := json.Marshal(typedWithMeta)
	require.NoError(t, err)
	var asMap map[string]any
	require.NoError(t, json.Unmarshal(raw, &asMap))

	want := map[string]any{
		"operation":       "UPDATE",
		"namespace":       "team-a",
		"name":            "shop",
		"object":          nil, // filled below
		"oldObject":       nil,
		"namespaceLabels": map[string]any{"env": "prod"},
		"userInfo":        map[string]any{"username": "alice", "uid": "u-1", "groups": []any{"team-a"}},
		"dryRun":          true,
	}
	var wantObject any
	require.NoError(t, json.Unmarshal(raw, &wantObject))
	want["object"] = wantObject

	tests := []struct {
		name   string
		object any
	}{
		{name: "typed deployment without TypeMeta", object: d},
		{name: "typed deployment with TypeMeta", object: typedWithMeta},
		{name: "raw admission JSON", object: raw},
		{name: "json.RawMessage", object: json.RawMessage(raw)},
		{name: "map", object: asMap},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in, err := NewInput(Request{
				Operation: "UPDATE", Namespace: "team-a", Name: "shop", Object: tt.object,
				NamespaceLabels: map[string]string{"env": "prod"},
				UserInfo:        UserInfo{Username: "alice", UID: "u-1", Groups: []string{"team-a"}},
				DryRun:          true,
			})
			require.NoError(t, err)
			b, err := json.Marshal(in)
			require.NoError(t, err)
			var got map[string]any
			require.NoError(t, json.Unmarshal(b, &got))
			assert.Equal(t, want, got)
		})
	}
}

func TestNewInputEmpty(t *testing.T) {
	in, err := NewInput(Request{Operation: "DELETE", OldObject: []byte{}})
	require.NoError(t, err)
	b, err := json.Marshal(in)
	require.NoError(t, err)
	assert.JSONEq(t, `{"operation":"DELETE","namespace":"","name":"","object":null,"oldObject":null,
		"namespaceLabels":{},"userInfo":{"username":"","uid":"","groups":[]},"dryRun":false}`, string(b))
}

func TestNewInputBadJSON(t *testing.T) {
	tests := []struct {
		name string
		raw  []byte
	}{
		{name: "truncated", raw: []byte(`{"metadata":`)},
		{name: "trailing data", raw: []byte(`{} {}`)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := NewInput(Request{Operation: "CREATE", Object: tt.raw})
			assert.ErrorContains(t, err, "object: decoding JSON")
		})
	}
}
