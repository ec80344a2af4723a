package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"strings"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql"
	"github.com/prometheus/prometheus/rules"
	"github.com/prometheus/prometheus/tsdb"
)

// Firing is what `promql -fire` reports about one alert.
type Firing struct {
	Alert string `json:"alert"`
	// State is "firing", "pending" or "inactive" at the last evaluation.
	State       string            `json:"state"`
	Labels      map[string]string `json:"labels,omitempty"`
	Annotations map[string]string `json:"annotations,omitempty"`
}

// fire evaluates the alerting rule named alert, from the PrometheusRule
// files, the way Prometheus's rule manager does (rules.AlertingRule on a
// PromQL engine over a TSDB), on scrapes: /metrics texts taken step apart,
// loaded as the samples of successive scrapes. It evaluates at every scrape
// and then once more after the rule's `for`, so that a pending alert can
// fire.
func fire(rulesFiles []string, alert string, scrapes []string, step time.Duration) (Firing, error) {
	out := Firing{Alert: alert, State: "inactive"}
	rule, err := findAlert(rulesFiles, alert)
	if err != nil {
		return out, err
	}
	expr, err := promqlParser.ParseExpr(rule.Expr)
	if err != nil {
		return out, fmt.Errorf("%s: %w", alert, err)
	}
	dir, err := os.MkdirTemp("", "promql-fire-")
	if err != nil {
		return out, err
	}
	defer os.RemoveAll(dir)
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	db, err := tsdb.Open(dir, logger, nil, tsdb.DefaultOptions(), nil)
	if err != nil {
		return out, err
	}
	defer db.Close()

	start := time.Now().Add(-time.Duration(len(scrapes)) * step).Truncate(time.Second)
	for i, f := range scrapes {
		if err := load(db, f, start.Add(time.Duration(i)*step)); err != nil {
			return out, err
		}
	}
	engine := promql.NewEngine(promql.EngineOpts{
		Logger: logger, MaxSamples: 1_000_000, Timeout: time.Minute, LookbackDelta: 5 * time.Minute, Parser: promqlParser,
	})
	ar := rules.NewAlertingRule(alert, expr, time.Duration(rule.For), time.Duration(rule.KeepFiringFor),
		labels.FromMap(rule.Labels), labels.FromMap(rule.Annotations), labels.EmptyLabels(), "", false, logger)
	query := rules.EngineQueryFunc(engine, db)
	at := start
	for i := range scrapes {
		at = start.Add(time.Duration(i) * step)
		if _, err := ar.Eval(context.Background(), 0, at, query, nil, 0); err != nil {
			return out, fmt.Errorf("evaluating %s: %w", alert, err)
		}
	}
	// Once more after the rule's `for`, when the scrapes were too few for
	// it; not when it already fires: a rate over a window past the last
	// scrape is empty, and would resolve what fired.
	if rule.For > 0 && !firingNow(ar) {
		if _, err := ar.Eval(context.Background(), 0, at.Add(time.Duration(rule.For)), query, nil, 0); err != nil {
			return out, fmt.Errorf("evaluating %s: %w", alert, err)
		}
	}
	for _, a := range ar.ActiveAlerts() {
		out.State = a.State.String()
		out.Labels, out.Annotations = a.Labels.Map(), a.Annotations.Map()
		if a.State == rules.StateFiring {
			break
		}
	}
	return out, nil
}

func firingNow(ar *rules.AlertingRule) bool {
	for _, a := range ar.ActiveAlerts() {
		if a.State == rules.StateFiring {
			return true
		}
	}
	return false
}

func findAlert(files []string, alert string) (rulefmt.Rule, error) {
	for _, f := range files {
		groups, err := loadGroups(f)
		if err != nil {
			return rulefmt.Rule{}, err
		}
		for _, g := range groups.Groups {
			for _, r := range g.Rules {
				if r.Alert == alert {
					return r, nil
				}
			}
		}
	}
	return rulefmt.Rule{}, fmt.Errorf("no alert %q in %s", alert, strings.Join(files, ", "))
}

// load appends one scrape (Prometheus text format) at t.
func load(db *tsdb.DB, path string, t time.Time) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	p := expfmt.NewTextParser(model.UTF8Validation)
	families, err := p.TextToMetricFamilies(f)
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	app := db.Appender(context.Background())
	ts := t.UnixMilli()
	add := func(name string, m *dto.Metric, extra map[string]string, v float64) error {
		b := labels.NewBuilder(labels.EmptyLabels())
		b.Set(model.MetricNameLabel, name)
		for _, lp := range m.GetLabel() {
			b.Set(lp.GetName(), lp.GetValue())
		}
		for k, v := range extra {
			b.Set(k, v)
		}
		_, err := app.Append(0, b.Labels(), ts, v)
		return err
	}
	for name, mf := range families {
		for _, m := range mf.GetMetric() {
			var err error
			switch mf.GetType() {
			case dto.MetricType_COUNTER:
				err = add(name, m, nil, m.GetCounter().GetValue())
			case dto.MetricType_GAUGE:
				err = add(name, m, nil, m.GetGauge().GetValue())
			case dto.MetricType_UNTYPED:
				err = add(name, m, nil, m.GetUntyped().GetValue())
			case dto.MetricType_HISTOGRAM:
				h := m.GetHistogram()
				inf := false
				for _, bk := range h.GetBucket() {
					inf = inf || math.IsInf(bk.GetUpperBound(), 1)
					if err = add(name+"_bucket", m, map[string]string{"le": model.FloatString(bk.GetUpperBound()).String()}, float64(bk.GetCumulativeCount())); err != nil {
						break
					}
				}
				if err == nil && !inf {
					err = add(name+"_bucket", m, map[string]string{"le": "+Inf"}, float64(h.GetSampleCount()))
				}
				if err == nil {
					err = add(name+"_sum", m, nil, h.GetSampleSum())
				}
				if err == nil {
					err = add(name+"_count", m, nil, float64(h.GetSampleCount()))
				}
			case dto.MetricType_SUMMARY:
				s := m.GetSummary()
				if err = add(name+"_sum", m, nil, s.GetSampleSum()); err == nil {
					err = add(name+"_count", m, nil, float64(s.GetSampleCount()))
				}
			}
			if err != nil {
				_ = app.Rollback()
				return fmt.Errorf("%s: %s: %w", path, name, err)
			}
		}
	}
	return app.Commit()
}
