package policy

import (
	"bytes"
	"encoding/json"
	"errors"
	"testing"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// viaEncodingJSON is the conversion jsonValue replaces: encoding/json with
// numbers kept exact, then OPA's own conversion.
func viaEncodingJSON(b []byte) (ast.Value, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var doc any
	if err := dec.Decode(&doc); err != nil {
		return nil, err
	}
	// JSON's whitespace only: bytes.TrimSpace would also take \f, \v and
	// Unicode spaces, which encoding/json's Unmarshal refuses (found by
	// FuzzJSONValue: "0\f").
	if len(bytes.TrimLeft(b[dec.InputOffset():], " \t\r\n")) > 0 {
		return nil, errTrailing
	}
	return ast.InterfaceToValue(doc)
}

var errTrailing = errors.New("trailing data")

var jsonCorpus = []string{
	`{}`, `[]`, `null`, `true`, `false`, `0`, `-1`, `12345678901234567890123`, `1.5e-3`, `-0.0`, `1E+2`,
	`"plain"`, `"esc\"aped \\ \/ \n \t \u00e9 \ud83d\ude00"`, `"ünïcödé"`,
	`{"a":1,"a":2}`, `{"a":1,"\u0061":2}`, `{"\u0061":1,"\u0061":2}`, `{"metadata":{"name":"web","labels":{"app":"web"}},"spec":{"replicas":3,"template":{"spec":{"containers":[{"name":"c","image":"nginx:1.27"}]}}}}`,
	` { "spaced" : [ 1 , 2 , { } , [ ] ] } `,
}

// jsonValue gives exactly the value encoding/json and OPA's conversion give.
func TestJSONValueAgreesWithEncodingJSON(t *testing.T) {
	raw, err := json.Marshal(realisticDeployment())
	require.NoError(t, err)
	for _, doc := range append(jsonCorpus, string(raw)) {
		want, err := viaEncodingJSON([]byte(doc))
		require.NoError(t, err, doc)
		got, err := jsonValue([]byte(doc))
		require.NoError(t, err, doc)
		assert.Equal(t, 0, want.Compare(got), "%s:\nwant %v\ngot  %v", doc, want, got)
	}
}

func TestJSONValueRefusesWhatEncodingJSONRefuses(t *testing.T) {
	for _, doc := range []string{``, `{`, `{"a"}`, `{"a":}`, `{"a":1,}`, `[1,]`, `01`, `1.`, `.5`, `-`, `1e`, `"unterminated`,
		"\"ctl\x01\"", `tru`, `nul`, `{} {}`, `{"a":1}x`, `[` + string(bytes.Repeat([]byte("["), 2000)), `"\x"`, `"\u12"`} {
		_, err := jsonValue([]byte(doc))
		assert.Error(t, err, "%q", doc)
		_, err = viaEncodingJSON([]byte(doc))
		assert.Error(t, err, "encoding/json refuses %q too", doc)
	}
}

// FuzzJSONValue: on any input, jsonValue never panics, accepts exactly what
// encoding/json accepts (within the nesting bound) and gives the same value.
func FuzzJSONValue(f *testing.F) {
	for _, doc := range jsonCorpus {
		f.Add([]byte(doc))
	}
	raw, err := json.Marshal(realisticDeployment())
	require.NoError(f, err)
	f.Add(raw)
	f.Add([]byte(`{"metadata":{"managedFields":[{"manager":"m","fieldsV1":{"f:a":{}}}]}}`))
	// Escapes in what is skipped, checked in place: as the API server
	// writes them, and each way one can be invalid.
	f.Add([]byte(`{"metadata":{"managedFields":[{"fieldsV1":{"k:{\"name\":\"c\"}":{".":{}},"\u00e9\/\b\f\n\r\t\\":{}}}]}}`))
	for _, bad := range []string{`\x`, `\u12`, `\u12g4`, `\`, `\u`, "\\\x01"} {
		f.Add([]byte(`{"metadata":{"managedFields":["a` + bad + `"]}}`))
		f.Add([]byte(`{"spec":{"paused":"` + bad + `"}}`))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		got, err := jsonValue(b)
		want, wantErr := viaEncodingJSON(b)
		if bytes.Count(b, []byte("["))+bytes.Count(b, []byte("{")) > maxDepth {
			return // nesting bound: ours refuses what encoding/json may accept
		}
		// Each check fails through require only when it fails: the fuzzer
		// runs this for every input.
		if (err == nil) != (wantErr == nil) {
			require.FailNow(t, "jsonValue and encoding/json disagree on an error", "jsonValue error %v, encoding/json error %v, on %q", err, wantErr, b)
		}
		if err == nil && want.Compare(got) != 0 {
			require.FailNow(t, "jsonValue and encoding/json disagree", "jsonValue %v, encoding/json %v, on %q", got, want, b)
		}
		whole, apiErr := apiObjectValue(b, wholeValue)
		if (apiErr == nil) != (err == nil) {
			require.FailNow(t, "apiObjectValue and jsonValue disagree on an error", "apiObjectValue error %v, jsonValue error %v, on %q", apiErr, err, b)
		}
		// What a projection leaves out is checked as strictly, and what it
		// keeps is built as the whole value has it.
		part, partErr := apiObjectValue(b, fuzzReads)
		if (partErr == nil) != (apiErr == nil) || partErr != nil && partErr.Error() != apiErr.Error() {
			require.FailNow(t, "a projection and the whole value disagree on an error", "projected error %v, whole error %v, on %q", partErr, apiErr, b)
		}
		if partErr == nil {
			if want := projected(whole, fuzzReads); want.Compare(part) != 0 {
				require.FailNow(t, "a projection differs from the whole value's", "projected %v, want %v, on %q", part, want, b)
			}
		}
	})
}

// fuzzReads reads a few members, by name, by index and through any.
var fuzzReads = func() *projection {
	p := &projection{}
	for _, path := range [][]step{
		{{key: "spec"}, {key: "template"}, {key: "spec"}, {key: "containers"}, {any: true}, {key: "image"}},
		{{key: "metadata"}, {key: "name"}},
		{{key: "a"}, {key: "1"}, {key: "b"}},
		{{any: true}, {key: "x"}},
	} {
		p.add(path)
	}
	p.touch([]step{{key: "status"}, {any: true}})
	p.normalize()
	return p
}()

// projected is v as a projection reads it: the reference for the parser.
func projected(v ast.Value, p *projection) ast.Value {
	if p.whole {
		return v
	}
	switch x := v.(type) {
	case ast.Object:
		out := ast.NewObject()
		x.Foreach(func(k, m *ast.Term) {
			if c := p.child(string(k.Value.(ast.String))); c != nil {
				out.Insert(k, ast.NewTerm(projected(m.Value, c)))
			}
		})
		return out
	case *ast.Array:
		out := make([]*ast.Term, x.Len())
		for i := range x.Len() {
			out[i] = ast.NullTerm()
			if c := p.element(i); c != nil {
				out[i] = ast.NewTerm(projected(x.Elem(i).Value, c))
			}
		}
		return ast.NewArray(out...)
	}
	return v
}

// BenchmarkJSONValue compares the one-pass conversion with the encoding/json
// and ast.InterfaceToValue it replaces, on a realistic Deployment.
func BenchmarkJSONValue(b *testing.B) {
	raw, err := json.Marshal(realisticDeployment())
	require.NoError(b, err)
	b.Run("one-pass", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := jsonValue(raw); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("encoding-json", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := viaEncodingJSON(raw); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// An API object's input leaves out metadata.managedFields, and only that.
func TestAPIObjectValueLeavesOutManagedFields(t *testing.T) {
	withMF := `{"metadata":{"name":"web","managedFields":[{"manager":"kubectl","fieldsV1":{"f:spec":{"f:replicas":{}}}}],"labels":{"app":"web"}},"spec":{"managedFields":"kept: not metadata's"}}`
	without := `{"metadata":{"name":"web","labels":{"app":"web"}},"spec":{"managedFields":"kept: not metadata's"}}`
	want, err := jsonValue([]byte(without))
	require.NoError(t, err)
	got, err := apiObjectValue([]byte(withMF), wholeValue)
	require.NoError(t, err)
	assert.Equal(t, 0, want.Compare(got), "got %v", got)

	_, err = apiObjectValue([]byte(`{"metadata":{"managedFields":[{"manager":}]}}`), wholeValue)
	assert.Error(t, err, "what is left out is still checked")
}
