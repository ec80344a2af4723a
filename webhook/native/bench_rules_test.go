package native

import (
	"context"
	"testing"

	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apiserver/pkg/admission"
	"k8s.io/apiserver/pkg/authentication/user"
)

// BenchmarkRefusals measures one evaluation of deployguard-refusals, the
// policy kube-apiserver runs on every Deployment write, on a Deployment it
// admits: the cost of its expressions, the object already converted.
func BenchmarkRefusals(b *testing.B) {
	r, err := Load()
	if err != nil {
		b.Fatal(err)
	}
	d := rolling(3, intstr.FromString("25%"), intstr.FromString("25%"))
	in, err := inputOf(Request{Operation: admission.Create, Object: d, Namespace: "shop", Name: "web",
		User: &user.DefaultInfo{Name: "alice", Groups: []string{"system:authenticated"}}, Params: defaults.Params().obj})
	if err != nil {
		b.Fatal(err)
	}
	p := r.compiled[Refusals]
	b.ReportAllocs()
	for b.Loop() {
		if ds := p.evaluate(context.Background(), in); len(ds) != 0 {
			b.Fatalf("%+v", ds)
		}
	}
}

// BenchmarkWarningsAndBounds measures what the webhook evaluates in process
// on every CREATE of the default install: deployguard-warnings and
// deployguard-bounds, on a Deployment they pass, conversion included.
func BenchmarkWarningsAndBounds(b *testing.B) {
	r, err := Load()
	if err != nil {
		b.Fatal(err)
	}
	d := rolling(3, intstr.FromString("25%"), intstr.FromString("25%"))
	req := Request{Operation: admission.Create, Object: d, Namespace: "shop", Name: "web",
		User: &user.DefaultInfo{Name: "alice", Groups: []string{"system:authenticated"}}}
	params := defaults.Params()
	b.ReportAllocs()
	for b.Loop() {
		if fs := r.Evaluate(context.Background(), req, params, Warnings, Bounds); len(fs) != 0 {
			b.Fatalf("%+v", fs)
		}
	}
}
