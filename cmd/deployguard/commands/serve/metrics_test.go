package serve

import (
	"crypto/tls"
	"flag"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// /metrics is behind the API server's authentication and authorization
// unless the flag says otherwise, and then it serves the webhook's
// certificate; the opt-out serves plain HTTP.
func TestMetricsOptions(t *testing.T) {
	for _, tc := range []struct {
		name   string
		args   []string
		secure bool
	}{
		{name: "default", secure: true},
		{name: "explicitly secure", args: []string{"--metrics-secure=true"}, secure: true},
		{name: "opted out", args: []string{"--metrics-secure=false"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fs := flag.NewFlagSet("serve", flag.ContinueOnError)
			f, _ := bindServeFlags(fs)
			require.NoError(t, fs.Parse(append([]string{"--cert-dir=/certs", "--metrics-bind-address=:9090"}, tc.args...)))
			o := metricsOptions(f)
			assert.Equal(t, ":9090", o.BindAddress)
			assert.Equal(t, tc.secure, o.SecureServing)
			assert.Equal(t, tc.secure, o.FilterProvider != nil, "authentication and authorization filter")
			if !tc.secure {
				return
			}
			assert.Equal(t, "/certs", o.CertDir, "the webhook's serving certificate, which Prometheus can verify")
			c := &tls.Config{}
			for _, opt := range o.TLSOpts {
				opt(c)
			}
			assert.Equal(t, uint16(tls.VersionTLS12), c.MinVersion)
			assert.Equal(t, []string{"http/1.1"}, c.NextProtos, "no HTTP/2 (Rapid Reset)")
		})
	}
}
