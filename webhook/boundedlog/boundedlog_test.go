package boundedlog

import (
	"errors"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	admissionv1 "k8s.io/api/admission/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"
)

func TestValue(t *testing.T) {
	long := strings.Repeat("x", 1<<20)
	cut := String(long)
	tests := []struct {
		name string
		in   any
		want any
	}{
		{name: "a short string is kept", in: "CREATE", want: "CREATE"},
		{name: "a string of MaxValue bytes is kept", in: long[:MaxValue], want: long[:MaxValue]},
		{name: "a long string is cut", in: long, want: cut},
		{name: "a long operation (a named string type) is cut", in: admissionv1.Operation(long), want: cut},
		{name: "a long UID is cut", in: types.UID(long), want: cut},
		{name: "a short operation keeps its type", in: admissionv1.Create, want: admissionv1.Create},
		{name: "an object reference has its parts cut", in: klog.KRef(long, long), want: klog.ObjectRef{Name: cut, Namespace: cut}},
		{name: "a resource has its parts cut", in: metav1.GroupVersionResource{Group: long, Version: "v1", Resource: long},
			want: metav1.GroupVersionResource{Group: cut, Version: "v1", Resource: cut}},
		{name: "numbers, booleans and durations are kept", in: []any{3, int32(400), true, 1.5, time.Second},
			want: []any{3, int32(400), true, 1.5, time.Second}},
		{name: "a short slice is kept", in: []string{"system:authenticated"}, want: []string{"system:authenticated"}},
		{name: "a long slice is printed and cut", in: []string{long}, want: String("[" + long + "]")},
		{name: "nil is kept", in: nil, want: nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if in, ok := tt.in.([]any); ok {
				assert.Equal(t, tt.want, values(in))
				return
			}
			assert.Equal(t, tt.want, Value(tt.in))
		})
	}
}

func TestString(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		wantLen int
	}{
		{name: "ASCII is cut at MaxValue", in: strings.Repeat("a", 10*MaxValue), wantLen: MaxValue},
		// "é" is two bytes: the cut never splits one.
		{name: "a character is never split", in: "a" + strings.Repeat("é", MaxValue), wantLen: MaxValue - 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := String(tt.in)
			assert.True(t, utf8.ValidString(got))
			assert.Equal(t, tt.in[:tt.wantLen], got[:tt.wantLen])
			assert.Contains(t, got, "…[")
			assert.Less(t, len(got), MaxValue+32, "the note of the length is short")
		})
	}
}

// Every line a bounded logger writes is bounded, whatever the request holds
// and whichever way it is logged: the Webhook's constructor's values, a
// refusal's values, an error, a name.
func TestLinesAreBounded(t *testing.T) {
	junk := strings.Repeat("j", 4<<20)
	req := &admission.Request{AdmissionRequest: admissionv1.AdmissionRequest{
		UID: types.UID(junk), Name: junk, Namespace: junk, Operation: admissionv1.Operation(junk),
		Resource: metav1.GroupVersionResource{Group: junk, Version: junk, Resource: junk},
		UserInfo: authenticationv1.UserInfo{Username: junk},
	}}
	tests := []struct {
		name string
		log  func(logr.Logger)
	}{
		{name: "the Webhook's own values and an error", log: func(l logr.Logger) {
			Constructor(l, req).Error(errors.New("contentType="+junk+", expected application/json"), "unable to process a request with unknown content type")
		}},
		{name: "a refusal line", log: func(l logr.Logger) {
			Constructor(l, req).Info("refused", "operation", req.Operation, "deployment", klog.KRef(req.Namespace, req.Name),
				"user", req.UserInfo.Username, "message", junk, "code", int32(400))
		}},
		{name: "values given before and a name", log: func(l logr.Logger) {
			Logger(l).WithName(junk).WithValues("user", junk).V(0).Info(junk, "groups", []string{junk})
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var lines []string
			l := funcr.New(func(prefix, args string) { lines = append(lines, prefix+" "+args) }, funcr.Options{})
			tt.log(l)
			require.Len(t, lines, 1)
			// At most a dozen values of MaxValue bytes each, and their keys.
			assert.Less(t, len(lines[0]), 16*(MaxValue+64), "one line, bounded")
			assert.Contains(t, lines[0], "bytes]", "what was cut says so")
		})
	}
}

// The wrapper keeps the sink's call depth: a line is attributed to the
// caller, not to the wrapper.
func TestCallerIsKept(t *testing.T) {
	var caller funcr.Caller
	l := funcr.NewJSON(func(obj string) {
		caller = funcr.Caller{}
		if i := strings.Index(obj, `"caller":{"file":"`); i >= 0 {
			caller.File = obj[i+len(`"caller":{"file":"`):]
			caller.File = caller.File[:strings.IndexByte(caller.File, '"')]
		}
	}, funcr.Options{LogCaller: funcr.All})
	Logger(l).Info("here")
	assert.Equal(t, "boundedlog_test.go", caller.File)
}

// For a request within the bounds, a line reads as with controller-runtime's
// own constructor: the same keys, in the same order, the same values.
func TestConstructorLogsAsTheDefault(t *testing.T) {
	req := &admission.Request{AdmissionRequest: admissionv1.AdmissionRequest{
		UID: "0d1f", Name: "web", Namespace: "shop", Operation: admissionv1.Create,
		Resource: metav1.GroupVersionResource{Group: "apps", Version: "v1", Resource: "deployments"},
		UserInfo: authenticationv1.UserInfo{Username: "alice"},
	}}
	tests := []struct {
		name string
		log  func(logr.Logger)
	}{
		{name: "a line", log: func(l logr.Logger) { l.Info("refused", "reason", "policy") }},
		{name: "an error", log: func(l logr.Logger) { l.Error(errors.New("boom"), "unable to encode response") }},
		{name: "values added after", log: func(l logr.Logger) { l.WithValues("deployment", "web").WithName("x").Info("done", "n", 1) }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var got, want []string
			tt.log(Constructor(funcr.New(func(prefix, args string) { got = append(got, prefix+" "+args) }, funcr.Options{}), req))
			tt.log(admission.DefaultLogConstructor(funcr.New(func(prefix, args string) { want = append(want, prefix+" "+args) }, funcr.Options{}), req))
			assert.Equal(t, want, got)
		})
	}
}

// The logger made for each request copies nothing of the base logger until
// a line is logged: most requests log nothing.
func TestConstructorBindsNothingPerRequest(t *testing.T) {
	base := &countingSink{}
	req := &admission.Request{AdmissionRequest: admissionv1.AdmissionRequest{Name: "web", Namespace: "shop"}}
	for range 100 {
		Constructor(logr.New(base), req)
	}
	assert.Zero(t, base.withValues, "no copy of the logger per request")
	Constructor(logr.New(base), req).Info("refused")
	assert.Equal(t, 1, base.lines)
}

type countingSink struct{ withValues, lines int }

func (c *countingSink) Init(logr.RuntimeInfo)          {}
func (c *countingSink) Enabled(int) bool               { return true }
func (c *countingSink) Info(int, string, ...any)       { c.lines++ }
func (c *countingSink) Error(error, string, ...any)    { c.lines++ }
func (c *countingSink) WithValues(...any) logr.LogSink { c.withValues++; return c }
func (c *countingSink) WithName(string) logr.LogSink   { return c }

func TestConstructorOfADiscardingLogger(t *testing.T) {
	req := &admission.Request{AdmissionRequest: admissionv1.AdmissionRequest{Name: "web"}}
	assert.NotPanics(t, func() { Constructor(logr.Discard(), req).Info("refused", "name", "web") })
}
