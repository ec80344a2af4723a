// Command promql checks the guard's alerting rules and Grafana dashboards with
// Prometheus's own code: the rules of each PrometheusRule with rulefmt (the
// loader Prometheus runs, which parses every expression and every annotation
// template), each dashboard query with the promql parser. It prints, as JSON,
// every metric each expression selects and the label names it matches on, for
// test/install to look up in a running guard's /metrics.
//
// It is a module of its own because Prometheus's dependencies are heavy and
// only this check needs them.
//
// With -fire ALERT it evaluates one alert instead, with Prometheus's rule
// engine, on scrapes of a running guard's /metrics, and prints whether it
// fires (test/clients: an alert fires for a rollback).
//
// With -serve ADDR it is a stand-in Prometheus for the metric checks' tests
// (serve.go): the instant query API over a TSDB that tests fill with /load.
//
// usage: promql -rules FILE[,FILE] -dashboards FILE[,FILE]
//
//	promql -rules FILE -fire ALERT -scrapes FILE,FILE[,…] [-step 30s]
//	promql -serve 127.0.0.1:0
package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"regexp"
	"sort"
	"strings"
	"time"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql/parser"
	"go.yaml.in/yaml/v3"
)

// Query is one expression and what it selects.
type Query struct {
	// Source names the file and the alert or panel.
	Source    string     `json:"source"`
	Expr      string     `json:"expr"`
	Selectors []Selector `json:"selectors"`
}

// Selector is one metric an expression reads, with the label names of its
// matchers (the metric name itself left out).
type Selector struct {
	Metric string   `json:"metric"`
	Labels []string `json:"labels,omitempty"`
}

func main() {
	rules := flag.String("rules", "", "comma-separated PrometheusRule manifests")
	dashboards := flag.String("dashboards", "", "comma-separated Grafana dashboard JSON files")
	alert := flag.String("fire", "", "evaluate this alert of -rules on -scrapes instead, and print whether it fires")
	scrapes := flag.String("scrapes", "", "with -fire: comma-separated /metrics texts, scraped -step apart")
	step := flag.Duration("step", 30*time.Second, "with -fire: the time between two scrapes")
	addr := flag.String("serve", "", "serve the query API on this address instead (prints its URL first)")
	flag.Parse()
	if *addr != "" {
		if err := serve(*addr, os.Stdout); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		return
	}
	if *alert != "" {
		f, err := fire(split(*rules), *alert, split(*scrapes), *step)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		_ = json.NewEncoder(os.Stdout).Encode(f)
		return
	}
	qs, err := check(split(*rules), split(*dashboards))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	if err := enc.Encode(qs); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

func split(s string) []string {
	if s == "" {
		return nil
	}
	return strings.Split(s, ",")
}

var promqlParser = parser.NewParser(parser.Options{})

func check(rules, dashboards []string) ([]Query, error) {
	var qs []Query
	var errs []error
	for _, f := range rules {
		q, err := checkRules(f)
		qs = append(qs, q...)
		errs = append(errs, err)
	}
	for _, f := range dashboards {
		q, err := checkDashboard(f)
		qs = append(qs, q...)
		errs = append(errs, err)
	}
	return qs, errors.Join(errs...)
}

// checkRules loads a PrometheusRule's spec (its groups) as Prometheus loads a
// rule file.
func checkRules(path string) ([]Query, error) {
	groups, err := loadGroups(path)
	if err != nil {
		return nil, err
	}
	var qs []Query
	for _, g := range groups.Groups {
		for _, r := range g.Rules {
			name := r.Alert
			if name == "" {
				name = r.Record
			}
			q, err := query(fmt.Sprintf("%s: %s/%s", path, g.Name, name), r.Expr)
			if err != nil {
				return qs, err
			}
			qs = append(qs, q)
		}
	}
	return qs, nil
}

// loadGroups reads the rule groups of a PrometheusRule manifest with
// Prometheus's own rule file loader.
func loadGroups(path string) (*rulefmt.RuleGroups, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var obj struct {
		Kind string    `yaml:"kind"`
		Spec yaml.Node `yaml:"spec"`
	}
	if err := yaml.Unmarshal(b, &obj); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if obj.Kind != "PrometheusRule" {
		return nil, fmt.Errorf("%s: kind %q, want PrometheusRule", path, obj.Kind)
	}
	spec, err := yaml.Marshal(&obj.Spec)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	groups, errs := rulefmt.Parse(spec, false, model.UTF8Validation, promqlParser, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if len(errs) > 0 {
		return nil, fmt.Errorf("%s: %w", path, errors.Join(errs...))
	}
	return groups, nil
}

type panel struct {
	Title   string  `json:"title"`
	Panels  []panel `json:"panels"` // a collapsed row's
	Targets []struct {
		Expr string `json:"expr"`
	} `json:"targets"`
}

// grafanaVariables are Grafana's built-in interval variables, replaced as
// Grafana would before a query reaches Prometheus. Any other variable is an
// error: the dashboard defines none but the data source.
var grafanaVariables = strings.NewReplacer("$__rate_interval", "5m", "$__interval", "1m", "$__range", "1h")

var leftover = regexp.MustCompile(`\$\{?[A-Za-z_]+`)

func checkDashboard(path string) ([]Query, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var d struct {
		Panels []panel `json:"panels"`
	}
	if err := json.Unmarshal(b, &d); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	var qs []Query
	var errs []error
	var walk func([]panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			walk(p.Panels)
			for _, t := range p.Targets {
				expr := grafanaVariables.Replace(t.Expr)
				src := fmt.Sprintf("%s: panel %q", path, p.Title)
				if v := leftover.FindString(expr); v != "" {
					errs = append(errs, fmt.Errorf("%s: unknown variable %s in %s", src, v, t.Expr))
					continue
				}
				q, err := query(src, expr)
				if err != nil {
					errs = append(errs, err)
					continue
				}
				qs = append(qs, q)
			}
		}
	}
	walk(d.Panels)
	if len(qs) == 0 && len(errs) == 0 {
		errs = append(errs, fmt.Errorf("%s: no queries", path))
	}
	return qs, errors.Join(errs...)
}

func query(source, expr string) (Query, error) {
	e, err := promqlParser.ParseExpr(expr)
	if err != nil {
		return Query{}, fmt.Errorf("%s: %w", source, err)
	}
	q := Query{Source: source, Expr: expr}
	parser.Inspect(e, func(n parser.Node, _ []parser.Node) error {
		vs, ok := n.(*parser.VectorSelector)
		if !ok {
			return nil
		}
		s := Selector{Metric: vs.Name}
		for _, m := range vs.LabelMatchers {
			if m.Name != model.MetricNameLabel {
				s.Labels = append(s.Labels, m.Name)
			}
		}
		sort.Strings(s.Labels)
		q.Selectors = append(q.Selectors, s)
		return nil
	})
	if len(q.Selectors) == 0 {
		return q, fmt.Errorf("%s: selects no metric: %s", source, expr)
	}
	return q, nil
}
