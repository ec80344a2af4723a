package prom

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"golang.org/x/time/rate"

	"github.com/deployguard/deployguard/reconciler/analysis"
)

// MaxBodyBytes bounds the answer read from Prometheus.
const MaxBodyBytes = 1 << 20

// Client queries one Prometheus. It is safe for concurrent use; the guard
// holds one, so that its QPS bound is cluster-wide.
type Client struct {
	url      string
	endpoint string
	timeout  time.Duration
	http     *http.Client
	token    *tokenFile // nil: no Authorization header
	turns    *turns
}

// New validates cfg (zero Timeout, QPS and Burst take the defaults), reads
// its CA file and checks its token file, and returns the client.
func New(cfg Config) (*Client, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.WithDefaults()
	tlsConfig := &tls.Config{MinVersion: tls.VersionTLS12, InsecureSkipVerify: cfg.InsecureSkipVerify} //nolint:gosec // opt-in, for tests
	if cfg.CAFile != "" {
		pem, err := os.ReadFile(cfg.CAFile)
		if err != nil {
			return nil, fmt.Errorf("prometheus: caFile: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("prometheus: caFile %s holds no PEM certificate: give the CA bundle that signed Prometheus's certificate", cfg.CAFile)
		}
		tlsConfig.RootCAs = pool
	}
	transport := http.DefaultTransport.(*http.Transport).Clone()
	transport.TLSClientConfig = tlsConfig
	// Keep as many connections as may be busy at once.
	transport.MaxIdleConnsPerHost = max(cfg.Burst, 2)
	c := &Client{
		url:     strings.TrimRight(cfg.URL, "/"),
		timeout: cfg.Timeout,
		http:    &http.Client{Transport: transport},
		turns:   newTurns(rate.NewLimiter(rate.Limit(cfg.QPS), cfg.Burst)),
	}
	c.endpoint = c.url + "/api/v1/query"
	if cfg.BearerTokenFile != "" {
		c.token = &tokenFile{path: cfg.BearerTokenFile}
		if _, err := c.token.get(); err != nil {
			return nil, fmt.Errorf("prometheus: %w", err)
		}
	}
	return c, nil
}

// URL is Prometheus's base URL, for logs.
func (c *Client) URL() string { return c.url }

// Reserve takes the right to send one query now for the caller key (a
// revision's metric) and returns 0, or returns how long until its turn.
// The caller (a reconciler) requeues after that delay instead of blocking a
// worker, so that a cluster-wide image bump of hundreds of Deployments
// queues its measurements rather than flooding Prometheus; it comes back
// with the same key, and its turn is kept for it (turns). Safe for
// concurrent use.
func (c *Client) Reserve(key string) time.Duration {
	return c.turns.take(key, time.Now())
}

// Query evaluates query at the instant at (Prometheus's now when at is zero),
// within the client's time-out, and returns its result: a scalar as
// analysis.Scalar, an instant vector as analysis.Vector of its samples'
// values in result order (empty when no series matched). It does not consult
// Reserve. Its errors are *Error.
func (c *Client) Query(ctx context.Context, query string, at time.Time) (analysis.Value, error) {
	form := url.Values{}
	form.Set("query", query)
	if !at.IsZero() {
		form.Set("time", strconv.FormatFloat(float64(at.UnixMilli())/1000, 'f', 3, 64))
	}
	form.Set("timeout", strconv.FormatFloat(c.timeout.Seconds(), 'f', -1, 64))

	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.endpoint, strings.NewReader(form.Encode()))
	if err != nil {
		return analysis.Value{}, &Error{Kind: KindUnreachable, Msg: fmt.Sprintf("querying Prometheus at %s: %v", c.url, err), err: err}
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Accept", "application/json")
	req.Header.Set("User-Agent", "deployguard")
	if c.token != nil {
		tok, err := c.token.get()
		if err != nil {
			return analysis.Value{}, &Error{Kind: KindToken, Msg: "querying Prometheus: " + err.Error(), err: err}
		}
		req.Header.Set("Authorization", "Bearer "+tok)
	}

	resp, err := c.http.Do(req)
	if err != nil {
		return analysis.Value{}, c.unreachable(ctx, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, MaxBodyBytes+1))
	if err != nil {
		return analysis.Value{}, c.unreachable(ctx, err)
	}
	over := len(body) > MaxBodyBytes
	ok := resp.StatusCode >= 200 && resp.StatusCode < 300
	if !ok {
		if e, isAPI := apiError(body); isAPI && !over {
			return analysis.Value{}, newAPIError(resp.StatusCode, e)
		}
		return analysis.Value{}, &Error{Kind: KindHTTP, Msg: fmt.Sprintf("Prometheus at %s answered HTTP %d (%s)", c.url, resp.StatusCode, httpHint(resp.StatusCode))}
	}
	if over {
		return analysis.Value{}, &Error{Kind: KindDecode, Msg: fmt.Sprintf("Prometheus's response over 1 MiB (%d bytes at most): the query must return a scalar or a few samples; aggregate it", MaxBodyBytes)}
	}
	return decode(body)
}

// unreachable is a transport failure: no answer, or no whole answer, in time.
func (c *Client) unreachable(ctx context.Context, err error) *Error {
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return &Error{Kind: KindUnreachable, Msg: fmt.Sprintf("Prometheus at %s did not answer within %s (the query's time-out)", c.url, c.timeout), err: err}
	}
	var ue *url.Error
	if errors.As(err, &ue) {
		err = ue.Err // the method and URL are said once, below
	}
	return &Error{Kind: KindUnreachable, Msg: fmt.Sprintf("Prometheus at %s unreachable: %v", c.url, err), err: err}
}

// httpHint says what an HTTP status usually means here.
func httpHint(code int) string {
	switch {
	case code == http.StatusUnauthorized || code == http.StatusForbidden:
		return "check bearerTokenFile and the token's permissions"
	case code == http.StatusNotFound:
		return "check the url: queries go to <url>/api/v1/query"
	case code >= 500:
		return "Prometheus or a proxy in front of it is failing"
	}
	return http.StatusText(code)
}
