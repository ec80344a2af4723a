package load

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strings"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/deployguard/deployguard/test/harness"
)

// Metrics are the families of one scrape of a /metrics endpoint.
type Metrics map[string]*dto.MetricFamily

// Scrape reads the guard's /metrics, as Prometheus does (harness.Guard.Scrape:
// over TLS, with a token allowed to read them, unless the guard serves them
// in plain HTTP).
func Scrape(g *harness.Guard) (Metrics, error) {
	code, body, err := g.Scrape()
	if err != nil {
		return nil, err
	}
	if code != http.StatusOK {
		return nil, fmt.Errorf("GET /metrics: HTTP %d: %s", code, body)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	return p.TextToMetricFamilies(strings.NewReader(body))
}

// Sum adds the values of every series of a counter or gauge family whose
// labels include want.
func (m Metrics) Sum(name string, want map[string]string) float64 {
	f, ok := m[name]
	if !ok {
		return 0
	}
	total := 0.0
	for _, s := range f.GetMetric() {
		if !hasLabels(s, want) {
			continue
		}
		switch {
		case s.Counter != nil:
			total += s.Counter.GetValue()
		case s.Gauge != nil:
			total += s.Gauge.GetValue()
		case s.Untyped != nil:
			total += s.Untyped.GetValue()
		}
	}
	return total
}

// Histogram is a histogram's cumulative buckets.
type Histogram struct {
	Bounds []float64
	Counts []uint64 // cumulative, per bound
	Count  uint64
	Sum    float64 // of the observations
}

// Histogram returns the histogram series of a family with labels want.
func (m Metrics) Histogram(name string, want map[string]string) Histogram {
	var h Histogram
	f, ok := m[name]
	if !ok {
		return h
	}
	for _, s := range f.GetMetric() {
		if s.Histogram == nil || !hasLabels(s, want) {
			continue
		}
		for _, b := range s.Histogram.GetBucket() {
			h.Bounds = append(h.Bounds, b.GetUpperBound())
			h.Counts = append(h.Counts, b.GetCumulativeCount())
		}
		h.Count = s.Histogram.GetSampleCount()
		h.Sum = s.Histogram.GetSampleSum()
	}
	return h
}

// Minus is the histogram of the observations made between before and h.
func (h Histogram) Minus(before Histogram) Histogram {
	out := Histogram{Bounds: slices.Clone(h.Bounds), Counts: slices.Clone(h.Counts), Count: h.Count - before.Count, Sum: h.Sum - before.Sum}
	if len(before.Counts) == len(h.Counts) {
		for i := range out.Counts {
			out.Counts[i] -= before.Counts[i]
		}
	}
	return out
}

// Quantile estimates the q-quantile as Prometheus's histogram_quantile does:
// linear within the bucket it falls in.
func (h Histogram) Quantile(q float64) time.Duration {
	if h.Count == 0 || len(h.Bounds) == 0 {
		return 0
	}
	rank := q * float64(h.Count)
	lower, below := 0.0, uint64(0)
	for i, upper := range h.Bounds {
		if float64(h.Counts[i]) >= rank {
			inBucket := h.Counts[i] - below
			frac := 1.0
			if inBucket > 0 {
				frac = (rank - float64(below)) / float64(inBucket)
			}
			return time.Duration((lower + (upper-lower)*frac) * float64(time.Second))
		}
		lower, below = upper, h.Counts[i]
	}
	return time.Duration(h.Bounds[len(h.Bounds)-1] * float64(time.Second))
}

func hasLabels(s *dto.Metric, want map[string]string) bool {
	for k, v := range want {
		found := false
		for _, l := range s.GetLabel() {
			if l.GetName() == k && l.GetValue() == v {
				found = true
			}
		}
		if !found {
			return false
		}
	}
	return true
}

// SaveURL fetches url into the file at path.
func SaveURL(url, path string) error {
	return SaveURLWith(&http.Client{Timeout: time.Minute}, url, path)
}

// SaveURLWith is SaveURL through hc (an API server's authenticated client).
func SaveURLWith(hc *http.Client, url, path string) error {
	resp, err := hc.Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
