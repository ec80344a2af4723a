package prom

// ErrorKind says why a query failed, so that the caller can say so in an
// Event and count it without copying anything Prometheus sent.
type ErrorKind string

// The kinds of failure.
const (
	// KindUnreachable: no answer at all (dial, connection refused or reset,
	// TLS, DNS, or no answer within the time-out).
	KindUnreachable ErrorKind = "Unreachable"
	// KindHTTP: an answer other than 2xx that is not a Prometheus API error
	// (a proxy's 502, an ingress's 503, a 401 for a wrong token).
	KindHTTP ErrorKind = "HTTP"
	// KindAPI: Prometheus answered status "error" (a query that does not
	// parse, one that timed out inside Prometheus, too many samples).
	KindAPI ErrorKind = "API"
	// KindDecode: a success whose body cannot be used: not the API's JSON,
	// over 1 MiB, a range vector or a string, over 1000 samples.
	KindDecode ErrorKind = "Decode"
	// KindToken: the bearer token file cannot be read or is empty; the
	// query was not sent.
	KindToken ErrorKind = "Token"
)

// Error is a failed query. Msg never holds a response body: at most the
// error text of a Prometheus API error, cut at 256 bytes.
type Error struct {
	Kind ErrorKind
	Msg  string
	// err is the cause, for errors.Is (context.Canceled when the caller's
	// context ended).
	err error
}

func (e *Error) Error() string { return e.Msg }

// Unwrap returns the cause, if any.
func (e *Error) Unwrap() error { return e.err }

// maxAPIErrorBytes bounds the Prometheus error text kept in an Error.
const maxAPIErrorBytes = 256

// cut shortens s to at most n bytes without splitting a UTF-8 sequence.
func cut(s string, n int) string {
	if len(s) <= n {
		return s
	}
	i := n
	for i > 0 && s[i]&0xC0 == 0x80 { // a continuation byte: back off to its start
		i--
	}
	return s[:i] + "…"
}
