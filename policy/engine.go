package policy

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
)

// Engine holds the active policy set and evaluates requests against it. It is
// safe for concurrent use: evaluations read the active set without locks, and
// a new set is swapped in whole once it has compiled.
type Engine struct {
	opts    Options
	metrics *metrics
	active  atomic.Pointer[preparedSet]
	// loadMu serializes loads, so a slow compile of an older set cannot
	// overwrite a newer one.
	loadMu sync.Mutex
	// changed is closed, and replaced, each time a new set becomes active.
	changedMu sync.Mutex
	changed   chan struct{}
}

// PolicyInfo describes one policy of the active set.
type PolicyInfo struct {
	Name   string
	Source string
	Mode   Mode // the mode it runs in, Options applied
	// Severity and Category are custom.severity and custom.category of the
	// policy's METADATA, "" when it declares none.
	Severity, Category string
	// Digest changes when anything that decides the policy's findings does
	// (its module, a library module, its mode), and only then.
	Digest string
	// Deletes: the policy is evaluated on a DELETE, since it reads
	// input.operation, input.oldObject or input.object as a whole (see
	// "Deletions" in README.md). The others are not: a DELETE has no
	// input.object.
	Deletes bool
}

// New returns an Engine with an empty policy set: until the first successful
// Load, every request is allowed with no findings.
func New(opts Options) (*Engine, error) {
	opts, err := opts.withDefaults()
	if err != nil {
		return nil, fmt.Errorf("policy options: %w", err)
	}
	e := &Engine{opts: opts, metrics: newMetrics(), changed: make(chan struct{})}
	e.active.Store(&preparedSet{reads: wholeValue})
	return e, nil
}

// Collectors returns the Engine's Prometheus collectors for the caller to
// register, e.g. with controller-runtime's metrics.Registry.
func (e *Engine) Collectors() []prometheus.Collector {
	return e.metrics.collectors()
}

// Load compiles sources as one set and makes it active. If any source fails,
// Load returns a *LoadError naming each failing source and line, and the
// previous set stays active.
func (e *Engine) Load(ctx context.Context, sources []Source) error {
	e.loadMu.Lock()
	defer e.loadMu.Unlock()
	set, err := e.build(ctx, sources)
	if err != nil {
		return err
	}
	e.swap(set)
	return nil
}

// build compiles and prepares a set without activating it.
func (e *Engine) build(ctx context.Context, sources []Source) (*preparedSet, error) {
	cs, errs := compileSources(sources)
	if len(errs) > 0 {
		e.metrics.countLoadErrors(errs)
		return nil, &LoadError{Errors: errs}
	}
	set, err := prepare(ctx, cs, e.opts, e.metrics)
	if err != nil {
		e.metrics.countLoadErrors([]SourceError{{Message: err.Error()}})
		return nil, fmt.Errorf("preparing policy set: %w", err)
	}
	return set, nil
}

func (e *Engine) swap(set *preparedSet) {
	e.active.Store(set)
	e.metrics.active.Set(float64(len(set.policies)))
	e.changedMu.Lock()
	close(e.changed)
	e.changed = make(chan struct{})
	e.changedMu.Unlock()
}

// Changed returns a channel that is closed when the next policy set becomes
// active: the audit waits on it to re-evaluate what the new set judges.
func (e *Engine) Changed() <-chan struct{} {
	e.changedMu.Lock()
	defer e.changedMu.Unlock()
	return e.changed
}

// Policies lists the policies of the active set that are evaluated, by name.
func (e *Engine) Policies() []PolicyInfo { return e.Active().Policies() }
