package webhook

import (
	"bytes"
	"fmt"
	"testing"

	jsonv2 "github.com/go-json-experiment/json"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	admissionv1 "k8s.io/api/admission/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/runtime"
	kjson "sigs.k8s.io/json"

	"github.com/deployguard/deployguard/test/harness"
	"github.com/deployguard/deployguard/webhook/review/reviewtest"
)

// corpusDeployments are the Deployments of the differential tests' corpora
// (public charts, the upstream suite's manifests, the parity fixtures), as
// the API server sends them: JSON of the typed object.
func corpusDeployments(t testing.TB) map[string][]byte {
	t.Helper()
	ds, err := harness.CorpusDeployments()
	require.NoError(t, err)
	require.Greater(t, len(ds), 100, "the corpora's Deployments")
	out := make(map[string][]byte, len(ds))
	for i, d := range ds {
		out[fmt.Sprintf("corpus %d %s/%s", i, d.Namespace, d.Name)] = mustJSON(t, d)
	}
	return out
}

// TestDecodingAsTheAPIMachinery: the guard's one-pass decoding (encoding/json/v2's
// implementation) reads every Deployment, and every AdmissionReview, exactly
// as the API machinery's decoder (sigs.k8s.io/json) does, on the corpora and
// on what the API server never sends: duplicate or differently cased
// members, unknown fields, invalid UTF-8, nulls, numbers out of range.
func TestDecodingAsTheAPIMachinery(t *testing.T) {
	bodies := corpusDeployments(t)
	for name, d := range map[string]*appsv1.Deployment{"realistic": realistic(), "stored": reviewtest.Stored(), "guarded": reviewtest.Guarded()} {
		bodies[name] = mustJSON(t, d)
	}
	edge := map[string]string{
		"duplicate member":           `{"metadata":{"name":"a","name":"b"},"spec":{"replicas":1,"replicas":2}}`,
		"duplicate list":             `{"spec":{"template":{"spec":{"containers":[{"name":"a","image":"x"}],"containers":[{"name":"b"}]}}}}`,
		"duplicate then null":        `{"spec":{"minReadySeconds":5,"minReadySeconds":null}}`,
		"duplicate object null":      `{"metadata":{"name":"a"},"metadata":null}`,
		"duplicate map":              `{"metadata":{"labels":{"a":"1"},"labels":{"b":"2"}}}`,
		"member of another case":     `{"Metadata":{"name":"a"},"spec":{"Replicas":3}}`,
		"unknown members":            `{"metadata":{"name":"a","color":"red"},"spec":{"future":{"x":[1,2]},"replicas":2}}`,
		"invalid UTF-8":              "{\"metadata\":{\"name\":\"a\",\"labels\":{\"k\":\"\xff\xfe\"}}}",
		"escaped surrogate":          `{"metadata":{"name":"a\ud800"}}`,
		"nulls":                      `{"metadata":null,"spec":{"selector":null,"replicas":null,"template":{"spec":{"containers":null}}}}`,
		"empty":                      `{}`,
		"replicas out of range":      `{"spec":{"replicas":4294967296}}`,
		"replicas as a float":        `{"spec":{"replicas":1.5}}`,
		"replicas as a string":       `{"spec":{"replicas":"3"}}`,
		"replicas with exponent":     `{"spec":{"replicas":1e2}}`,
		"intstr forms":               `{"spec":{"strategy":{"rollingUpdate":{"maxSurge":1,"maxUnavailable":"25%"}}}}`,
		"quantity":                   `{"spec":{"template":{"spec":{"containers":[{"name":"c","resources":{"requests":{"cpu":"100m","memory":1024}}}]}}}}`,
		"time":                       `{"metadata":{"creationTimestamp":"2026-11-24T10:00:00Z","deletionTimestamp":null}}`,
		"bad time":                   `{"metadata":{"creationTimestamp":"yesterday"}}`,
		"managedFields":              `{"metadata":{"managedFields":[{"manager":"m","operation":"Apply","fieldsType":"FieldsV1","fieldsV1":{"f:spec":{"f:replicas":{}}}}]}}`,
		"template managedFields":     `{"metadata":{"managedFields":[{"manager":"m"}]},"spec":{"template":{"metadata":{"managedFields":[{"manager":"t","fieldsV1":{"f:x":{}}}]}}}}`,
		"bad managedFields":          `{"metadata":{"managedFields":"m"}}`,
		"bad template managedFields": `{"spec":{"template":{"metadata":{"managedFields":"m"}}}}`,
		"not an object":              `[]`,
		"truncated":                  `{"metadata":{"name":"a"`,
		"trailing data":              `{} {}`,
	}
	for name, b := range edge {
		bodies["edge: "+name] = []byte(b)
	}
	for name, b := range bodies {
		want := &appsv1.Deployment{}
		wantErr := kjson.UnmarshalCaseSensitivePreserveInts(b, want)
		got, err := decodeDeployment(runtime.RawExtension{Raw: b})
		if wantErr != nil {
			assert.Error(t, err, "%s: the API machinery refuses it (%v)", name, wantErr)
			continue
		}
		if assert.NoError(t, err, name) {
			assert.Equal(t, want, got, name)
		}
	}

	d := realistic()
	for name, b := range map[string][]byte{
		"create":  reviewBody(t, admissionv1.Create, d, nil),
		"update":  reviewBody(t, admissionv1.Update, d, reviewtest.Guarded()),
		"delete":  reviewBody(t, admissionv1.Delete, nil, reviewtest.Guarded()),
		"options": bytes.Replace(reviewBody(t, admissionv1.Create, d, nil), []byte(`"operation":"CREATE"`), []byte(`"operation":"CREATE","options":{"kind":"CreateOptions","apiVersion":"meta.k8s.io/v1","dryRun":["All"]},"userInfo":{"username":"alice","groups":["dev"],"extra":{"scopes":["a","b"]}}`), 1),
	} {
		var want admissionv1.AdmissionReview
		require.NoError(t, kjson.UnmarshalCaseSensitivePreserveInts(b, &want), name)
		got, ok := decodeReview(b, false, skips{})
		if assert.True(t, ok, "%s: decoded in one pass", name) {
			assert.Equal(t, want, got, name)
		}
		typed, ok := decodeReview(b, true, skips{})
		if assert.True(t, ok, "%s: decoded with its objects", name) {
			for _, o := range []*runtime.RawExtension{&typed.Request.Object, &typed.Request.OldObject} {
				if len(o.Raw) > 0 {
					d, err := decodeDeployment(runtime.RawExtension{Raw: o.Raw})
					require.NoError(t, err, name)
					assert.Equal(t, d, o.Object, name)
				}
				o.Object = nil
			}
			assert.Equal(t, want, typed, name)
		}
	}
	for name, b := range bodies {
		sameObjects(t, name, b)
	}
}

// sameObjects: a review of object (any bytes) decodes with its objects as
// Deployments when, and only when, the object decodes on its own; then with
// the same bytes and the same Deployment (sameReview).
func sameObjects(t *testing.T, name string, object []byte) {
	t.Helper()
	for _, member := range []string{"object", "oldObject"} {
		sameReview(t, name+" in "+member, []byte(`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"1","options":{"kind":"CreateOptions"},"`+member+`": `+string(object)+`}}`))
	}
	skipsCreatePodSpec(t, name, object)
	// As the API server writes them: the operation before the objects.
	for _, op := range []string{"CREATE", "UPDATE"} {
		sameReview(t, name+" in a "+op, []byte(`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"1","operation":"`+op+`","object":`+string(object)+`}}`))
	}
	// The operation repeated after the object: the object was read as a
	// CREATE's, the request is an UPDATE.
	sameReview(t, name+" in a CREATE turned UPDATE", []byte(`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"1","operation":"CREATE","object":`+string(object)+`,"operation":"UPDATE"}}`))
}

// sameWithoutCreatePodSpec: body decodes with Endpoint.SkipCreatePodSpec as
// it does without (plain, typed), but for the pod spec of a CREATE's object,
// which is left empty when the operation came before the object (as the API
// server writes it; otherwise it is decoded) and whose JSON is only checked:
// a CREATE whose pod spec is not a PodSpec then decodes, as nothing else can.
func sameWithoutCreatePodSpec(t *testing.T, name string, body []byte, plain admissionv1.AdmissionReview, ok bool, typed admissionv1.AdmissionReview, typedOK bool) {
	t.Helper()
	lazy, lazyOK := decodeReview(body, true, skips{createPodSpec: true})
	if !ok || !lazyOK {
		assert.False(t, lazyOK, "%s: skipping the pod spec, decoded where the review itself is not", name)
		assert.False(t, typedOK, "%s: skipping the pod spec, not decoded where it is", name)
		return
	}
	create := lazy.Request.Operation == admissionv1.Create
	got := *lazy.Request
	if !typedOK {
		assert.True(t, create, "%s: skipping the pod spec, decoded where the objects are not (not a CREATE)", name)
		if d, isDeployment := got.Object.Object.(*appsv1.Deployment); assert.True(t, isDeployment, name) {
			assert.Equal(t, corev1.PodSpec{}, d.Spec.Template.Spec, "%s: decoded only for want of its pod spec", name)
		}
		got.Object.Object, got.OldObject.Object = nil, nil
		assert.Equal(t, *plain.Request, got, "%s: skipping the pod spec, the rest as decoded alone", name)
		return
	}
	want := *typed.Request
	if d, isDeployment := got.Object.Object.(*appsv1.Deployment); create && isDeployment && want.Object.Object != nil &&
		apiequality.Semantic.DeepEqual(d.Spec.Template.Spec, corev1.PodSpec{}) {
		w := want.Object.Object.(*appsv1.Deployment).DeepCopy()
		w.Spec.Template.Spec = corev1.PodSpec{}
		want.Object.Object = w
	}
	assert.Equal(t, want, got, "%s: skipping the pod spec of a CREATE, the rest as decoded whole", name)
}

// sameWithoutManagedFields: body decodes with Endpoint.SkipManagedFields as
// it does without (plain, typed), but for the managed fields of its objects,
// which are left empty and whose JSON is only checked: an object whose
// managed fields are not ManagedFieldsEntries then decodes, as nothing else
// can.
func sameWithoutManagedFields(t *testing.T, name string, body []byte, plain admissionv1.AdmissionReview, ok bool, typed admissionv1.AdmissionReview, typedOK bool) {
	t.Helper()
	lazy, lazyOK := decodeReview(body, true, skips{managedFields: true})
	if !ok || !lazyOK {
		assert.False(t, lazyOK, "%s: skipping the managed fields, decoded where the review itself is not", name)
		assert.False(t, typedOK, "%s: skipping the managed fields, not decoded where it is", name)
		return
	}
	got := *lazy.Request
	for _, o := range []*runtime.RawExtension{&got.Object, &got.OldObject} {
		if d, isDeployment := o.Object.(*appsv1.Deployment); isDeployment {
			assert.Nil(t, d.ManagedFields, "%s: the managed fields are left undecoded", name)
		}
	}
	if !typedOK {
		// Decoded only for want of its managed fields: each object as it
		// decodes alone without them, the rest as the review alone.
		for _, o := range []*runtime.RawExtension{&got.Object, &got.OldObject} {
			if len(o.Raw) == 0 {
				continue
			}
			want := &appsv1.Deployment{}
			if assert.NoError(t, jsonv2.Unmarshal(o.Raw, want, decodeOptions[skips{managedFields: true}]), name) {
				assert.Equal(t, want, o.Object, name)
			}
		}
		got.Object.Object, got.OldObject.Object = nil, nil
		assert.Equal(t, *plain.Request, got, "%s: skipping the managed fields, the rest as decoded alone", name)
		return
	}
	want := *typed.Request
	for _, o := range []*runtime.RawExtension{&want.Object, &want.OldObject} {
		if d, isDeployment := o.Object.(*appsv1.Deployment); isDeployment {
			d = d.DeepCopy()
			d.ManagedFields = nil
			o.Object = d
		}
	}
	assert.Equal(t, want, got, "%s: skipping the managed fields, the rest as decoded whole", name)
}

// skipsCreatePodSpec: a CREATE written as the API server writes it, the
// operation first, decodes without its object's pod spec.
func skipsCreatePodSpec(t *testing.T, name string, object []byte) {
	t.Helper()
	body := []byte(`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"1","operation":"CREATE","object":` + string(object) + `}}`)
	lazy, ok := decodeReview(body, true, skips{createPodSpec: true})
	if !ok {
		return
	}
	if d, isDeployment := lazy.Request.Object.Object.(*appsv1.Deployment); isDeployment {
		assert.Equal(t, corev1.PodSpec{}, d.Spec.Template.Spec, "%s: a CREATE's pod spec is left undecoded", name)
	}
}

// sameReview: body, any bytes, decodes with its objects as Deployments
// (decodeReview's deployments) as it decodes without, but where an object
// does not decode as a Deployment: then not at all, and the handler, given
// the body by the Webhook, refuses that object as it would have. Decoded,
// each object has the bytes it has without, and the Deployment they decode
// to alone.
func sameReview(t *testing.T, name string, body []byte) {
	t.Helper()
	plain, ok := decodeReview(body, false, skips{})
	typed, typedOK := decodeReview(body, true, skips{})
	sameWithoutCreatePodSpec(t, name, body, plain, ok, typed, typedOK)
	sameWithoutManagedFields(t, name, body, plain, ok, typed, typedOK)
	if !ok {
		assert.False(t, typedOK, name)
		return
	}
	if !typedOK {
		_, errObject := decodeDeployment(plain.Request.Object)
		_, errOld := decodeDeployment(plain.Request.OldObject)
		notDeployment := func(raw runtime.RawExtension, err error) bool { return len(raw.Raw) > 0 && err != nil }
		assert.True(t, notDeployment(plain.Request.Object, errObject) || notDeployment(plain.Request.OldObject, errOld),
			"%s: refused with the review, so an object is refused alone", name)
		return
	}
	rest := *typed.Request
	for _, o := range []struct{ want, got runtime.RawExtension }{
		{plain.Request.Object, typed.Request.Object}, {plain.Request.OldObject, typed.Request.OldObject},
	} {
		assert.Equal(t, string(o.want.Raw), string(o.got.Raw), name)
		if len(o.want.Raw) == 0 {
			assert.Nil(t, o.got.Object, name)
			continue
		}
		want, err := decodeDeployment(o.want)
		if assert.NoError(t, err, name) {
			assert.Equal(t, want, o.got.Object, name)
		}
	}
	rest.Object.Object, rest.OldObject.Object = nil, nil
	assert.Equal(t, *plain.Request, rest, "%s: the rest of the request as decoded alone", name)
}

// TestReviewShapes: reviews the API server never sends decode with their
// objects as without, or go to the Webhook, never to a panic.
func TestReviewShapes(t *testing.T) {
	const head = `{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview",`
	obj := `{"metadata":{"name":"a"},"spec":{"replicas":2}}`
	pod := `{"metadata":{"name":"a"},"spec":{"template":{"spec":{"hostname":"h","containers":[{"name":"c","image":"i"}]}}}}`
	for name, body := range map[string]string{
		"request null":                    head + `"request":null}`,
		"no request":                      head + `"x":1}`,
		"request null, then a request":    head + `"request":null,"request":{"uid":"1","object":` + obj + `}}`,
		"a request, then null":            head + `"request":{"uid":"1","object":` + obj + `},"request":null}`,
		"two requests":                    head + `"request":{"uid":"1","object":` + obj + `},"request":{"name":"b"}}`,
		"request not an object":           head + `"request":"x"}`,
		"an object, then null":            head + `"request":{"uid":"1","object":` + obj + `,"object":null}}`,
		"null, then an object":            head + `"request":{"uid":"1","object":null,"object":` + obj + `}}`,
		"two objects":                     head + `"request":{"uid":"1","object":{"metadata":{"name":"a"}},"object":` + obj + `}}`,
		"an object not a Deployment":      head + `"request":{"uid":"1","object":{"spec":{"replicas":"x"}}}}`,
		"an object that is not an object": head + `"request":{"uid":"1","object":[1]}}`,
		"kind after the request":          `{"request":{"uid":"1","oldObject":` + obj + `},"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}`,
		"an old object in a CREATE":       head + `"request":{"uid":"1","operation":"CREATE","object":` + pod + `,"oldObject":` + pod + `}}`,
		"a CREATE, its object, then null": head + `"request":{"uid":"1","operation":"CREATE","object":` + pod + `,"object":null,"operation":"UPDATE"}}`,
		"an UPDATE turned CREATE":         head + `"request":{"uid":"1","operation":"UPDATE","object":` + pod + `,"operation":"CREATE"}}`,
		"the object before its CREATE":    head + `"request":{"uid":"1","object":` + pod + `,"operation":"CREATE"}}`,
		"a CREATE of a wrong pod spec":    head + `"request":{"uid":"1","operation":"CREATE","object":{"metadata":{"name":"a"},"spec":{"template":{"spec":{"containers":"x"}}}}}}`,
	} {
		sameReview(t, name, []byte(body))
	}
}

// FuzzDecoding: on any bytes, the one-pass decoding of a Deployment refuses
// what the API machinery refuses, and reads the same object from the rest.
// Where v2 alone refuses, the request is refused as malformed: the API server
// never sends such bytes.
func FuzzDecoding(f *testing.F) {
	for _, b := range corpusDeployments(f) {
		f.Add(b)
	}
	f.Add([]byte(`{"metadata":{"name":"a","name":"b"},"spec":{"replicas":1}}`))
	f.Add([]byte(`{"spec":{"template":{"spec":{"containers":[{"name":"a","image":"x"}],"containers":[{"name":"b"}]}}}}`))
	f.Add([]byte(`{"spec":{"minReadySeconds":5,"minReadySeconds":null},"metadata":{"name":"a"},"metadata":null}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		want := &appsv1.Deployment{}
		wantErr := kjson.UnmarshalCaseSensitivePreserveInts(b, want)
		got, err := decodeDeployment(runtime.RawExtension{Raw: b})
		switch {
		case wantErr != nil && err == nil:
			require.FailNow(t, "the API machinery refuses it, the guard reads it", "%v", wantErr)
		case wantErr == nil && err == nil:
			assert.Equal(t, want, got)
		}
		sameObjects(t, "fuzzed", b)
		sameReview(t, "fuzzed review", b)
	})
}
