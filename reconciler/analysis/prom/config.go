// Package prom is the guard's Prometheus client for metric checks: one
// instant query at a time, its answer decoded into an analysis.Value, its
// failure typed (Error), and a cluster-wide bound on queries per second that
// the caller consults (Reserve) rather than waits on.
package prom

import (
	"errors"
	"fmt"
	"net/url"
	"time"
)

// Defaults for the zero fields of a Config.
const (
	DefaultTimeout = 10 * time.Second
	DefaultQPS     = 20
	DefaultBurst   = 20
)

// Config is how the guard reaches Prometheus.
type Config struct {
	// URL is Prometheus's base URL, e.g.
	// https://prometheus.monitoring.svc:9090 (a path prefix such as
	// /prometheus is kept: queries go to <URL>/api/v1/query).
	URL string
	// CAFile is a PEM bundle that verifies Prometheus's certificate; empty
	// means the system roots.
	CAFile string
	// InsecureSkipVerify turns certificate verification off (tests only).
	InsecureSkipVerify bool
	// BearerTokenFile holds the token sent as `Authorization: Bearer`. It
	// is read again whenever its modification time changes, so a rotated
	// Secret mount is picked up without a restart.
	BearerTokenFile string
	// Timeout bounds one query, end to end, and is sent to Prometheus as
	// the query's `timeout`. Default 10s.
	Timeout time.Duration
	// QPS and Burst bound the queries the whole guard sends (see Reserve).
	// Defaults 20 and 20.
	QPS   float64
	Burst int
}

// WithDefaults returns the config with its zero Timeout, QPS and Burst set to
// the defaults.
func (c Config) WithDefaults() Config {
	if c.Timeout == 0 {
		c.Timeout = DefaultTimeout
	}
	if c.QPS == 0 {
		c.QPS = DefaultQPS
	}
	if c.Burst == 0 {
		c.Burst = DefaultBurst
	}
	return c
}

// Validate returns every problem of the config at once, each saying what to
// change. Zero Timeout, QPS and Burst are valid: they mean the defaults.
func (c Config) Validate() error {
	var errs []error
	errs = append(errs, validateURL(c.URL))
	if c.CAFile != "" && c.InsecureSkipVerify {
		errs = append(errs, errors.New("prometheus: set caFile or insecureSkipVerify, not both"))
	}
	if c.Timeout < 0 {
		errs = append(errs, fmt.Errorf("prometheus: timeout %s is negative: set a positive duration such as 10s, or leave it unset for 10s", c.Timeout))
	}
	if c.QPS < 0 {
		errs = append(errs, fmt.Errorf("prometheus: qps %g is negative: set a positive rate such as 20, or leave it unset for 20", c.QPS))
	}
	if c.Burst < 0 {
		errs = append(errs, fmt.Errorf("prometheus: burst %d is negative: set a positive count such as 20, or leave it unset for 20", c.Burst))
	}
	return errors.Join(errs...)
}

func validateURL(raw string) error {
	if raw == "" {
		return errors.New("prometheus: url is empty: set Prometheus's base URL, e.g. https://prometheus.monitoring.svc:9090")
	}
	u, err := url.Parse(raw)
	if err != nil {
		// The cause alone: the whole URL might carry credentials.
		return fmt.Errorf("prometheus: url does not parse: %w", errors.Unwrap(err))
	}
	switch {
	case u.Scheme != "http" && u.Scheme != "https":
		return fmt.Errorf("prometheus: url %q must start with http:// or https://", raw)
	case u.Host == "":
		return fmt.Errorf("prometheus: url %q has no host", raw)
	case u.User != nil:
		// It would show in every log line and Event that names the URL.
		return errors.New("prometheus: url must not carry credentials: put a token in bearerTokenFile instead")
	case u.RawQuery != "" || u.Fragment != "":
		return fmt.Errorf("prometheus: url %q must not have a query or a fragment: give the base URL only", raw)
	}
	return nil
}
