package policy

import (
	"bytes"
	"encoding/json"
	"fmt"

	"github.com/open-policy-agent/opa/v1/ast"
	appsv1 "k8s.io/api/apps/v1"
)

// Request is what the webhook and the check command know about one admission
// request, in plain values, so this package stays free of admission types.
type Request struct {
	// Operation is "CREATE", "UPDATE" or "DELETE".
	Operation string
	// Namespace and Name of the Deployment. Name may be empty on CREATE with
	// generateName.
	Namespace string
	Name      string
	// Object and OldObject are the Deployment after and before the request: a
	// *appsv1.Deployment, a map[string]any, raw JSON ([]byte or
	// json.RawMessage, as in an AdmissionRequest), or nil when absent.
	Object    any
	OldObject any
	// NamespaceLabels are the labels of the request's namespace.
	NamespaceLabels map[string]string
	// UserInfo is who sent the request.
	UserInfo UserInfo
	// DryRun is true for server-side dry runs.
	DryRun bool
}

// UserInfo identifies the requester as the API server authenticated him.
type UserInfo struct {
	Username string
	UID      string
	Groups   []string
}

// Input is a Request converted once into the document policies see as
// `input`. It is immutable and may be evaluated by several Engines.
type Input struct {
	req   Request
	doc   map[string]any
	value ast.Value
}

// NewInput converts r. Objects go through a JSON round trip so that policies
// see exactly the JSON shape of the API object, wherever the input was built.
func NewInput(r Request) (*Input, error) {
	object, err := jsonDocument(r.Object)
	if err != nil {
		return nil, fmt.Errorf("object: %w", err)
	}
	oldObject, err := jsonDocument(r.OldObject)
	if err != nil {
		return nil, fmt.Errorf("oldObject: %w", err)
	}
	// Empty collections rather than null, so a rule can index them without
	// first checking that they exist.
	labels := make(map[string]any, len(r.NamespaceLabels))
	for k, v := range r.NamespaceLabels {
		labels[k] = v
	}
	groups := make([]any, len(r.UserInfo.Groups))
	for i, g := range r.UserInfo.Groups {
		groups[i] = g
	}
	doc := map[string]any{
		"operation":       r.Operation,
		"namespace":       r.Namespace,
		"name":            r.Name,
		"object":          object,
		"oldObject":       oldObject,
		"namespaceLabels": labels,
		"userInfo": map[string]any{
			"username": r.UserInfo.Username,
			"uid":      r.UserInfo.UID,
			"groups":   groups,
		},
		"dryRun": r.DryRun,
	}
	value, err := ast.InterfaceToValue(doc)
	if err != nil {
		return nil, fmt.Errorf("converting input for rego: %w", err)
	}
	r.UserInfo.Groups = append([]string(nil), r.UserInfo.Groups...)
	return &Input{req: r, doc: doc, value: value}, nil
}

// Request returns the request the Input was built from.
func (in *Input) Request() Request {
	return in.req
}

// MarshalJSON renders the input document exactly as policies see it, for
// "check --show-input" and for writing Rego tests from real requests.
func (in *Input) MarshalJSON() ([]byte, error) {
	return json.Marshal(in.doc)
}

// jsonDocument converts an object to its JSON shape: nil, a map or a slice of
// plain values, numbers as json.Number so integers stay exact.
func jsonDocument(obj any) (any, error) {
	var raw []byte
	switch o := obj.(type) {
	case nil:
		return nil, nil
	case []byte:
		raw = o
	case json.RawMessage:
		raw = o
	case *appsv1.Deployment:
		if o == nil {
			return nil, nil
		}
		// A typed object decoded by a client often has no TypeMeta; the API
		// server always sends it, so fill it for the check command to match.
		if o.APIVersion == "" && o.Kind == "" {
			c := *o
			c.APIVersion, c.Kind = appsv1.SchemeGroupVersion.String(), "Deployment"
			o = &c
		}
		b, err := json.Marshal(o)
		if err != nil {
			return nil, fmt.Errorf("encoding deployment: %w", err)
		}
		raw = b
	default:
		b, err := json.Marshal(o)
		if err != nil {
			return nil, fmt.Errorf("encoding %T: %w", obj, err)
		}
		raw = b
	}
	if len(bytes.TrimSpace(raw)) == 0 {
		return nil, nil
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var doc any
	if err := dec.Decode(&doc); err != nil {
		return nil, fmt.Errorf("decoding JSON: %w", err)
	}
	if dec.More() {
		return nil, fmt.Errorf("decoding JSON: trailing data after the object")
	}
	return doc, nil
}
