// Package boundedlog bounds what one log line of the webhook port may carry.
// Whoever reaches the port chooses the strings of a request (its operation,
// kind, name, namespace, user, a Content-Type header, the messages that quote
// them), and an admission request may be megabytes: logged as they come, one
// request would make a log line of its own size. Every value a bounded logger
// logs is cut to MaxValue bytes, whatever logs it: the guard's refusal lines
// and controller-runtime's admission.Webhook alike (Constructor).
package boundedlog

import (
	"errors"
	"fmt"
	"reflect"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/go-logr/logr"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"
)

// MaxValue is the most bytes of a value (a string, an error's text, a value
// printed) that one log line keeps; the rest is replaced by a note of the
// value's length. A Kubernetes name (at most 253 bytes) and a refusal of a
// few problems fit; a junk operation or a megabyte of message does not.
const MaxValue = 512

// Constructor is an admission.Webhook's LogConstructor: the values of
// controller-runtime's default one (the object, namespace, name, resource,
// user and request ID of each request), through a bounded logger, so that
// the Webhook's own lines (a body it cannot read, a Content-Type it
// refuses) and the handlers' lines, which log through the logger the
// Webhook puts in the request's context, are bounded too.
//
// The request's values are added when a line is logged, not when the
// logger is made, once per request: most requests log nothing, and binding
// them costs every request a copy of the logger (zap encodes them at once;
// controller-runtime's logger, before its SetLogger, keeps each such copy
// until then, for ever in a test or a fuzzing worker).
func Constructor(base logr.Logger, req *admission.Request) logr.Logger {
	l := Logger(base)
	s, ok := l.GetSink().(*sink)
	if req == nil || !ok { // no sink: a logger that discards
		return l
	}
	return l.WithSink(&sink{next: s.next, req: req})
}

// Logger returns l with every value, key-value pair and error cut to
// MaxValue bytes.
func Logger(l logr.Logger) logr.Logger {
	s := l.GetSink()
	if s == nil {
		return l
	}
	if _, ok := s.(*sink); ok {
		return l
	}
	return l.WithSink(&sink{next: s})
}

// sink bounds every value before next sees it. req, when set, is the
// request whose values go first on every line (Constructor).
type sink struct {
	next logr.LogSink
	req  *admission.Request
}

var _ logr.CallDepthLogSink = &sink{}

func (s *sink) Init(info logr.RuntimeInfo) { s.next.Init(info) }
func (s *sink) Enabled(level int) bool     { return s.next.Enabled(level) }
func (s *sink) WithName(name string) logr.LogSink {
	return &sink{next: s.next.WithName(String(name)), req: s.req}
}

func (s *sink) Info(level int, msg string, kv ...any) {
	s.logger().Info(level, String(msg), s.values(kv)...)
}

func (s *sink) Error(err error, msg string, kv ...any) {
	if err != nil {
		if text := err.Error(); len(text) > MaxValue {
			err = errors.New(String(text))
		}
	}
	s.logger().Error(err, String(msg), s.values(kv)...)
}

func (s *sink) WithValues(kv ...any) logr.LogSink {
	if len(kv) == 0 {
		return s
	}
	// The request's values stay before the ones added after them.
	return &sink{next: s.next.WithValues(s.values(kv)...)}
}

func (s *sink) WithCallDepth(depth int) logr.LogSink {
	if cd, ok := s.next.(logr.CallDepthLogSink); ok {
		return &sink{next: cd.WithCallDepth(depth), req: s.req}
	}
	return s
}

// logger is next, one frame deeper: ours, between the caller and next.
func (s *sink) logger() logr.LogSink {
	if cd, ok := s.next.(logr.CallDepthLogSink); ok {
		return cd.WithCallDepth(1)
	}
	return s.next
}

// values returns the request's values (as admission.DefaultLogConstructor
// gives them), then kv, each bounded, in a new slice: kv may be the caller's.
func (s *sink) values(kv []any) []any {
	if s.req == nil {
		return values(kv)
	}
	r := s.req
	return values(append([]any{"object", klog.KRef(r.Namespace, r.Name), "namespace", r.Namespace, "name", r.Name,
		"resource", r.Resource, "user", r.UserInfo.Username, "requestID", r.UID}, kv...))
}

// values returns kv with each value bounded, in a new slice: kv may be the
// caller's.
func values(kv []any) []any {
	out := make([]any, len(kv))
	for i, v := range kv {
		out[i] = Value(v)
	}
	return out
}

// Value returns v bounded for a log line: a string or error of more than
// MaxValue bytes is cut; an object reference has its name and namespace
// cut, and so are the parts of a request's kind and resource; a number, a boolean, a time or a duration is returned as it is;
// anything else whose printed form is longer than MaxValue is returned as
// that form, cut.
func Value(v any) any {
	switch x := v.(type) {
	case nil, bool, int, int8, int16, int32, int64, uint, uint8, uint16, uint32, uint64, uintptr,
		float32, float64, time.Duration, time.Time:
		return v
	case string:
		return String(x)
	case error:
		if text := x.Error(); len(text) > MaxValue {
			return errors.New(String(text))
		}
		return x
	case klog.ObjectRef:
		return klog.ObjectRef{Name: String(x.Name), Namespace: String(x.Namespace)}
	case metav1.GroupVersionResource: // a request's resource
		return metav1.GroupVersionResource{Group: String(x.Group), Version: String(x.Version), Resource: String(x.Resource)}
	case metav1.GroupVersionKind: // a request's kind
		return metav1.GroupVersionKind{Group: String(x.Group), Version: String(x.Version), Kind: String(x.Kind)}
	}
	rv := reflect.ValueOf(v)
	switch rv.Kind() {
	case reflect.String: // a named string type: an operation, a UID
		if len(rv.String()) <= MaxValue {
			return v
		}
		return String(rv.String())
	case reflect.Bool, reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Float32, reflect.Float64:
		return v
	}
	if p := fmt.Sprint(v); len(p) > MaxValue {
		return String(p)
	}
	return v
}

// String returns s if it has at most MaxValue bytes, and otherwise its first
// bytes (whole UTF-8 characters) followed by how long s was.
func String(s string) string {
	if len(s) <= MaxValue {
		return s
	}
	n := MaxValue
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	// A new string: the cut one must not keep s's bytes alive.
	return s[:n] + "…[" + strconv.Itoa(len(s)) + " bytes]"
}
