// Package leader runs the work only one replica may do in leadership terms
// that end without ending the process.
package leader

import (
	"context"
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	ctrlconfig "sigs.k8s.io/controller-runtime/pkg/config"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
)

// Terms runs the work only one replica may do (the rollout reconciler
// and what it adds) in a manager of its own for each leadership term, over the
// process's cache. controller-runtime's manager ends the process when it
// cannot renew its lease (10 s of API server trouble by default); here that
// ends only the term: the webhooks, which never depended on the lease, keep
// serving, and the replica campaigns again at once.
type Terms struct {
	RestConfig *rest.Config
	Scheme     *runtime.Scheme
	// Cache is the process's cache, started by the main manager.
	Cache cache.Cache
	// Elect, ID and Namespace: the Lease, as --leader-elect and
	// --leader-election-id set it.
	Elect     bool
	ID        string
	Namespace string
	// Setup adds a term's work to its manager.
	Setup []func(ctx context.Context, mgr ctrl.Manager) error
	// Pause is the wait before campaigning again after a term ends on an error.
	Pause time.Duration
}

// NeedLeaderElection: the terms campaign themselves; the main manager starts
// them on every replica.
func (l *Terms) NeedLeaderElection() bool { return false }

// Start campaigns and runs one term after another until ctx ends.
func (l *Terms) Start(ctx context.Context) error {
	log := ctrl.Log.WithName("leader")
	for term := 1; ; term++ {
		err := l.run(ctx)
		if ctx.Err() != nil {
			return nil
		}
		log.Error(err, "Leadership term ended; campaigning again while the webhooks keep serving", "term", term, "reason", "LeadershipLost")
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(l.Pause):
		}
	}
}

// run is one term: campaign, then run the work until the lease is lost or ctx
// ends.
func (l *Terms) run(ctx context.Context) error {
	mgr, err := ctrl.NewManager(l.RestConfig, ctrl.Options{
		Scheme: l.Scheme,
		NewCache: func(*rest.Config, cache.Options) (cache.Cache, error) {
			return sharedCache{l.Cache}, nil
		},
		// The main manager serves metrics, probes and webhooks.
		Metrics:                       metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress:        "0",
		LeaderElection:                l.Elect,
		LeaderElectionID:              l.ID,
		LeaderElectionNamespace:       l.Namespace,
		LeaderElectionReleaseOnCancel: true,
		// Each term registers the same controllers again, in one process.
		Controller: ctrlconfig.Controller{SkipNameValidation: ptr.To(true)},
	})
	if err != nil {
		return fmt.Errorf("creating the leader's manager: %w", err)
	}
	for _, s := range l.Setup {
		if err := s(ctx, mgr); err != nil {
			return err
		}
	}
	return mgr.Start(ctx)
}

// sharedCache lends the process's cache to a term's manager: that manager
// reads and watches through it, but does not start or stop it.
type sharedCache struct{ cache.Cache }

func (sharedCache) Start(ctx context.Context) error {
	<-ctx.Done()
	return nil
}
