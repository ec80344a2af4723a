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
	value ast.Value
}

// NewInput converts r. Objects are read as JSON, so that policies see exactly
// the JSON shape of the API object, wherever the input was built.
func NewInput(r Request) (*Input, error) { return newInput(r, wholeValue) }

// newInput converts r, building of input.object and input.oldObject only
// what reads reads (the active set's inputReads): an object no policy
// reads is null, and converting the rest of a Deployment, its env above all, was
// most of the cost of the input.
func newInput(r Request, reads *projection) (*Input, error) {
	object, err := inputPart(r.Object, reads, "object")
	if err != nil {
		return nil, err
	}
	oldObject, err := inputPart(r.OldObject, reads, "oldObject")
	if err != nil {
		return nil, err
	}
	// Empty collections rather than null, so a rule can index them without
	// first checking that they exist.
	labels := make([][2]*ast.Term, 0, len(r.NamespaceLabels))
	for k, v := range r.NamespaceLabels {
		labels = append(labels, ast.Item(ast.StringTerm(k), ast.StringTerm(v)))
	}
	groups := make([]*ast.Term, len(r.UserInfo.Groups))
	for i, g := range r.UserInfo.Groups {
		groups[i] = ast.StringTerm(g)
	}
	value := ast.NewObject(
		ast.Item(ast.StringTerm("operation"), ast.StringTerm(r.Operation)),
		ast.Item(ast.StringTerm("namespace"), ast.StringTerm(r.Namespace)),
		ast.Item(ast.StringTerm("name"), ast.StringTerm(r.Name)),
		ast.Item(ast.StringTerm("object"), ast.NewTerm(object)),
		ast.Item(ast.StringTerm("oldObject"), ast.NewTerm(oldObject)),
		ast.Item(ast.StringTerm("namespaceLabels"), ast.ObjectTerm(labels...)),
		ast.Item(ast.StringTerm("userInfo"), ast.ObjectTerm(
			ast.Item(ast.StringTerm("username"), ast.StringTerm(r.UserInfo.Username)),
			ast.Item(ast.StringTerm("uid"), ast.StringTerm(r.UserInfo.UID)),
			ast.Item(ast.StringTerm("groups"), ast.ArrayTerm(groups...)),
		)),
		ast.Item(ast.StringTerm("dryRun"), ast.BooleanTerm(r.DryRun)),
	)
	r.UserInfo.Groups = append([]string(nil), r.UserInfo.Groups...)
	return &Input{req: r, value: value}, nil
}

// Request returns the request the Input was built from.
func (in *Input) Request() Request {
	return in.req
}

// MarshalJSON renders the input document exactly as policies see it, for
// writing Rego tests from real requests (NewInput builds it whole).
func (in *Input) MarshalJSON() ([]byte, error) {
	doc, err := ast.JSON(in.value)
	if err != nil {
		return nil, err
	}
	return json.Marshal(doc)
}

// inputPart is the member name of input for obj, as far as reads reads it.
// An object no policy reads is null, but checked all the same: a malformed
// one is an error whatever the set reads.
func inputPart(obj any, reads *projection, name string) (ast.Value, error) {
	part := reads.child(name)
	check := part
	if check == nil {
		check = &projection{}
	}
	v, err := jsonDocument(obj, check)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	if part == nil {
		return ast.Null{}, nil
	}
	return v, nil
}

// jsonDocument converts an object to the Rego value of its JSON, as far as
// reads reads it: null when absent, numbers exact.
func jsonDocument(obj any, reads *projection) (ast.Value, error) {
	var raw []byte
	switch o := obj.(type) {
	case nil:
		return ast.Null{}, nil
	case []byte:
		raw = o
	case json.RawMessage:
		raw = o
	case *appsv1.Deployment:
		if o == nil {
			return ast.Null{}, nil
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
		return ast.Null{}, nil
	}
	v, err := apiObjectValue(raw, reads)
	if err != nil {
		return nil, fmt.Errorf("decoding JSON: %w", err)
	}
	return v, nil
}
