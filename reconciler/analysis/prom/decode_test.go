package prom

import (
	"math"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/deployguard/deployguard/reconciler/analysis"
)

func TestDecode(t *testing.T) {
	many := `{"status":"success","data":{"resultType":"vector","result":[` +
		strings.Repeat(`{"metric":{},"value":[1,"1"]},`, MaxSamples) + `{"metric":{},"value":[1,"1"]}]}}`
	tests := []struct {
		name    string
		body    string
		want    analysis.Value
		kind    ErrorKind
		errHas  string
		checkFn func(t *testing.T, v analysis.Value)
	}{
		{name: "scalar", body: `{"status":"success","data":{"resultType":"scalar","result":[1700000000.5,"0.25"]}}`, want: analysis.Scalar(0.25)},
		{name: "vector in result order", body: `{"status":"success","data":{"resultType":"vector","result":[{"metric":{"pod":"b"},"value":[1,"2"]},{"metric":{"pod":"a"},"value":[1,"1"]}]}}`, want: analysis.Vector([]float64{2, 1})},
		{name: "empty vector", body: `{"status":"success","data":{"resultType":"vector","result":[]}}`, want: analysis.Vector(nil)},
		{name: "infinities", body: `{"status":"success","data":{"resultType":"vector","result":[{"metric":{},"value":[1,"+Inf"]},{"metric":{},"value":[1,"-Inf"]}]}}`, want: analysis.Vector([]float64{math.Inf(1), math.Inf(-1)})},
		{name: "NaN scalar", body: `{"status":"success","data":{"resultType":"scalar","result":[1,"NaN"]}}`, checkFn: func(t *testing.T, v analysis.Value) {
			assert.Equal(t, "NaN", v.String())
		}},
		{name: "matrix refused", body: `{"status":"success","data":{"resultType":"matrix","result":[]}}`, kind: KindDecode, errHas: "must return a scalar or an instant vector"},
		{name: "string refused", body: `{"status":"success","data":{"resultType":"string","result":[1,"x"]}}`, kind: KindDecode, errHas: "must return a scalar or an instant vector"},
		{name: "over 1000 samples", body: many, kind: KindDecode, errHas: "1001 samples, over the 1000"},
		{name: "native histogram", body: `{"status":"success","data":{"resultType":"vector","result":[{"metric":{},"histogram":[1,{"count":"1"}]}]}}`, kind: KindDecode, errHas: "native histogram"},
		{name: "value not a number", body: `{"status":"success","data":{"resultType":"scalar","result":[1,"abc"]}}`, kind: KindDecode, errHas: `"abc" is not a number`},
		{name: "not JSON", body: `<html>secret page</html>`, kind: KindDecode, errHas: "invalid JSON at byte"},
		{name: "API error in a 2xx", body: `{"status":"error","errorType":"bad_data","error":"parse error"}`, kind: KindAPI, errHas: "bad_data: parse error"},
		{name: "unknown status", body: `{"status":"maybe"}`, kind: KindDecode, errHas: `status "maybe"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v, err := decode([]byte(tt.body))
			if tt.kind != "" {
				var e *Error
				require.ErrorAs(t, err, &e)
				assert.Equal(t, tt.kind, e.Kind)
				assert.Contains(t, e.Error(), tt.errHas)
				assert.NotContains(t, e.Error(), "secret page")
				return
			}
			require.NoError(t, err)
			if tt.checkFn != nil {
				tt.checkFn(t, v)
				return
			}
			assert.Equal(t, tt.want, v)
		})
	}
}

func TestCut(t *testing.T) {
	assert.Equal(t, "abc", cut("abc", 3))
	assert.Equal(t, "ab…", cut("abc", 2))
	// "é" is two bytes: never split it.
	assert.Equal(t, "a…", cut("aé", 2))
}

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		name   string
		cfg    Config
		errHas []string
	}{
		{name: "minimal", cfg: Config{URL: "http://prometheus:9090"}},
		{name: "path prefix", cfg: Config{URL: "https://mon.example/prometheus/", CAFile: "/ca.crt", BearerTokenFile: "/t", Timeout: 5e9, QPS: 5, Burst: 1}},
		{name: "empty url", cfg: Config{}, errHas: []string{"url is empty"}},
		{name: "no scheme", cfg: Config{URL: "prometheus:9090"}, errHas: []string{"must start with http:// or https://"}},
		{name: "credentials", cfg: Config{URL: "https://u:hunter2@prometheus"}, errHas: []string{"must not carry credentials"}},
		{name: "query", cfg: Config{URL: "https://prometheus/?x=1"}, errHas: []string{"must not have a query"}},
		{name: "every problem at once", cfg: Config{URL: "http://p", CAFile: "/ca", InsecureSkipVerify: true, Timeout: -1, QPS: -1, Burst: -1},
			errHas: []string{"not both", "timeout -1ns is negative", "qps -1 is negative", "burst -1 is negative"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.cfg.Validate()
			if len(tt.errHas) == 0 {
				assert.NoError(t, err)
				return
			}
			require.Error(t, err)
			for _, s := range tt.errHas {
				assert.Contains(t, err.Error(), s)
			}
			assert.NotContains(t, err.Error(), "hunter2")
		})
	}
}

func TestConfigWithDefaults(t *testing.T) {
	got := Config{URL: "http://p"}.WithDefaults()
	assert.Equal(t, Config{URL: "http://p", Timeout: DefaultTimeout, QPS: DefaultQPS, Burst: DefaultBurst}, got)
	set := Config{URL: "http://p", Timeout: 3e9, QPS: 2, Burst: 4}
	assert.Equal(t, set, set.WithDefaults())
}
