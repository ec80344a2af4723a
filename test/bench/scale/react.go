package main

import (
	"context"
	"fmt"
	"os"
	"slices"
	"sync"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deployguard/deployguard/reconciler/rollout"
	"github.com/deployguard/deployguard/reconciler/vocab"
	"github.com/deployguard/deployguard/test/bench/load"
)

// failFastWindow is the window the live Deployments set themselves
// (vocab.AnnotationFailFast), so that the guard's default config stays as
// deployed and the bench waits 15 s rather than its 60 s.
const failFastWindow = 15 * time.Second

// labelLive marks the Deployments that roll out for real, and their pods,
// so that the bench's watches see them alone.
const labelLive = "bench.deployguard.io/live"

// bumped is one rollout of live Deployments at once: how long the failing
// ones took to be rolled back, the healthy ones to be marked known-good.
type bumped struct {
	Deployments int `json:"deployments"`
	Failing     int `json:"failing"`
	// Writes: the time the bench took to send every Deployment's update.
	Writes time.Duration `json:"writesNs"`
	// Reaction: from the first pod status in ImagePullBackOff to the
	// rollback write (the Deployment labelled rolled-back), the fail-fast
	// window included.
	Reaction spread `json:"reaction"`
	// KnownGood: from the update's write to the new revision marked
	// known-good.
	KnownGood spread `json:"knownGood"`
	// MaxQueue is the deepest the reconciler's queue was meanwhile.
	MaxQueue int64 `json:"maxQueueDepth"`
}

type spread struct {
	Median time.Duration `json:"medianNs"`
	Worst  time.Duration `json:"worstNs"`
	Best   time.Duration `json:"bestNs"`
}

func spreadOf(ds []time.Duration) spread {
	if len(ds) == 0 {
		return spread{}
	}
	slices.Sort(ds)
	return spread{Median: ds[len(ds)/2], Worst: ds[len(ds)-1], Best: ds[0]}
}

// live is the i-th live Deployment: dealt round the namespaces as the fill's.
func (b *bench) live(i int) client.ObjectKey {
	return client.ObjectKey{Namespace: b.namespace(i % b.o.namespaces), Name: fmt.Sprintf("live-%04d", i)}
}

// reactions creates the live Deployments (one replica, a ConfigMap of their
// own mounted, which the guard snapshots once a revision is known-good),
// waits until their first revision is known-good, then rolls one out to an
// image that cannot be pulled alone, then bumps every other one's image at
// once, a tenth of them to such an image.
func (b *bench) reactions(ctx context.Context) (single, bump bumped, err error) {
	n := b.o.live + 1
	fmt.Printf("Creating %d Deployments with a replica and waiting until each is known-good …\n", n)
	start := time.Now()
	if err := parallel(ctx, 0, n, b.o.clients, b.createLive); err != nil {
		return single, bump, err
	}
	all := make([]int, n)
	for i := range all {
		all[i] = i
	}
	if err := b.waitKnownGood(ctx, all, 1); err != nil {
		return single, bump, err
	}
	fmt.Printf("  known-good after %s\n", time.Since(start).Round(100*time.Millisecond))
	fmt.Println("Rolling one Deployment out to an image that cannot be pulled …")
	if single, err = b.bump(ctx, all[:1], 1); err != nil {
		return single, bump, err
	}
	fmt.Printf("  rolled back %s after its first failing pod status\n", single.Reaction.Median.Round(10*time.Millisecond))
	fmt.Printf("Bumping the image of %d Deployments at once, %d of them to an image that cannot be pulled …\n", n-1, (n-1)/10)
	if bump, err = b.bump(ctx, all[1:], (n-1)/10); err != nil {
		return single, bump, err
	}
	fmt.Printf("  rolled back: median %s, worst %s; known-good: median %s, worst %s; deepest queue %d\n",
		bump.Reaction.Median.Round(10*time.Millisecond), bump.Reaction.Worst.Round(10*time.Millisecond),
		bump.KnownGood.Median.Round(10*time.Millisecond), bump.KnownGood.Worst.Round(10*time.Millisecond), bump.MaxQueue)
	return single, bump, nil
}

func (b *bench) createLive(ctx context.Context, i int) error {
	k := b.live(i)
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: k.Namespace, Name: k.Name + "-config"},
		Data: map[string]string{"app.yaml": fmt.Sprintf("name: %s\nlogLevel: info\n", k.Name)}}
	if err := retry(ctx, func() error { return b.c.Create(ctx, cm) }); err != nil {
		return err
	}
	d := load.Deployment(k.Namespace, k.Name, 1, b.o.containers, b.o.envVars)
	d.Labels[labelLive] = "true"
	d.Spec.Template.Labels[labelLive] = "true"
	d.Annotations = map[string]string{vocab.AnnotationFailFast: failFastWindow.String()}
	d.Spec.Template.Spec.Volumes[0].VolumeSource = corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{
		LocalObjectReference: corev1.LocalObjectReference{Name: cm.Name}}}
	return retry(ctx, func() error { return b.c.Create(ctx, d) })
}

// waitKnownGood waits until the newest known-good revision of each of the
// live Deployments is revision.
func (b *bench) waitKnownGood(ctx context.Context, live []int, revision int64) error {
	want := map[client.ObjectKey]bool{}
	for _, i := range live {
		want[b.live(i)] = true
	}
	return wait.PollUntilContextTimeout(ctx, time.Second, 15*time.Minute, true, func(ctx context.Context) (bool, error) {
		l := &appsv1.DeploymentList{}
		if err := b.c.List(ctx, l, client.MatchingLabels{labelLive: "true"}); err != nil {
			return false, nil
		}
		done := 0
		for i := range l.Items {
			d := &l.Items[i]
			if !want[client.ObjectKeyFromObject(d)] {
				continue
			}
			if lg, _ := rollout.ReadLedger(d); lg.Newest() != nil && lg.Newest().Revision == revision {
				done++
			}
		}
		return done == len(want), nil
	})
}

// bump rolls the live Deployments out to revision 2, the first failing ones
// to an image that cannot be pulled (kwok's image-pull-backoff stage), the
// others to a new one, and times both ends of each on watches.
func (b *bench) bump(ctx context.Context, live []int, failing int) (bumped, error) {
	r := bumped{Deployments: len(live), Failing: failing}
	t := &timings{failing: map[client.ObjectKey]bool{}, failed: map[client.ObjectKey]time.Time{},
		rolledBack: map[client.ObjectKey]time.Time{}, knownGood: map[client.ObjectKey]time.Time{}, done: make(chan struct{})}
	for j, i := range live {
		t.failing[b.live(i)] = j < failing
	}
	sel := client.MatchingLabels{labelLive: "true"}
	watching, stop := context.WithCancel(ctx)
	defer stop()
	from := func(rv string) *client.ListOptions {
		return &client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: rv}}
	}
	openPods := func(rv string) (watch.Interface, error) { return b.c.Watch(watching, &corev1.PodList{}, sel, from(rv)) }
	openDeployments := func(rv string) (watch.Interface, error) {
		return b.c.Watch(watching, &appsv1.DeploymentList{}, sel, from(rv))
	}
	pods, err := openPods("")
	if err != nil {
		return r, err
	}
	deployments, err := openDeployments("")
	if err != nil {
		pods.Stop()
		return r, err
	}
	go follow(watching, "pods", pods, openPods, t.pod)
	go follow(watching, "Deployments", deployments, openDeployments, t.deployment)
	peaks := b.watchPeaks()
	t.start(time.Now())
	err = parallel(ctx, 0, len(live), b.o.clients, func(ctx context.Context, j int) error {
		k := b.live(live[j])
		image := "registry.example.com/bench/c0:2.0.0"
		if j < failing {
			image = "registry.example.com/bench/c0:404"
		}
		patch := []byte(fmt.Sprintf(`{"spec":{"template":{"spec":{"containers":[{"name":"c0","image":%q}]}}}}`, image))
		return retry(ctx, func() error {
			return b.c.Patch(ctx, &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: k.Namespace, Name: k.Name}}, client.RawPatch(types.StrategicMergePatchType, patch))
		})
	})
	r.Writes = time.Since(t.began)
	if err != nil {
		peaks.end()
		return r, err
	}
	select {
	case <-t.done:
	case <-time.After(15 * time.Minute):
	case <-ctx.Done():
	}
	_, _, r.MaxQueue = peaks.end()
	return t.result(r)
}

// timings pairs, per live Deployment, its failure with its rollback, or its
// update with its new revision marked known-good.
type timings struct {
	mu         sync.Mutex
	began      time.Time
	failing    map[client.ObjectKey]bool
	failed     map[client.ObjectKey]time.Time
	rolledBack map[client.ObjectKey]time.Time
	knownGood  map[client.ObjectKey]time.Time
	done       chan struct{}
	closed     bool
}

func (t *timings) start(at time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.began = at
}

// follow hands handle the events of w, and once the API server ends it (a
// timeout, a watcher too slow for it) those of a new one from open, until
// ctx ends. The new one resumes from the last resourceVersion seen, so no
// event in between is missed or late; where the API server no longer has
// it (410 Gone), it starts from the current state, whose initial events
// time a state when it is seen, not lose it.
func follow(ctx context.Context, what string, w watch.Interface, open func(resourceVersion string) (watch.Interface, error), handle func(watch.Event)) {
	rv := ""
	for {
		for ended := false; !ended; {
			select {
			case <-ctx.Done():
				w.Stop()
				return
			case ev, ok := <-w.ResultChan():
				switch {
				case !ok:
					ended = true
				case ev.Type == watch.Error:
					err := apierrors.FromObject(ev.Object)
					fmt.Fprintf(os.Stderr, "bench-scale: the watch of %s: %v\n", what, err)
					if apierrors.IsResourceExpired(err) || apierrors.IsGone(err) {
						rv, ended = "", true
					}
				default:
					if o, err := meta.Accessor(ev.Object); err == nil {
						rv = o.GetResourceVersion()
					}
					handle(ev)
				}
			}
		}
		w.Stop()
		fmt.Fprintf(os.Stderr, "bench-scale: the watch of %s ended; watching again from resourceVersion %q\n", what, rv)
		for {
			var err error
			if w, err = open(rv); err == nil {
				break
			}
			if apierrors.IsResourceExpired(err) || apierrors.IsGone(err) {
				rv = ""
			}
			select {
			case <-ctx.Done():
				return
			case <-time.After(time.Second):
			}
		}
	}
}

// pod notes the first pod status of each failing Deployment's new pods in
// ImagePullBackOff.
func (t *timings) pod(ev watch.Event) {
	p, ok := ev.Object.(*corev1.Pod)
	if !ok {
		return
	}
	for _, cs := range p.Status.ContainerStatuses {
		if cs.State.Waiting != nil && cs.State.Waiting.Reason == "ImagePullBackOff" {
			// A watch opened again replays a failure it missed: once the
			// rollback is seen, timing the failure then would shorten the
			// reaction.
			t.note(t.failed, client.ObjectKey{Namespace: p.Namespace, Name: p.Labels["app.kubernetes.io/name"]}, time.Now(), t.rolledBack)
		}
	}
}

// deployment notes each rollback write (the rolled-back label set to the
// failed revision, 2) and each revision 2 marked known-good; an ADDED event
// too, which a watch opened again starts with.
func (t *timings) deployment(ev watch.Event) {
	d, ok := ev.Object.(*appsv1.Deployment)
	if !ok || ev.Type != watch.Modified && ev.Type != watch.Added {
		return
	}
	now, k := time.Now(), client.ObjectKeyFromObject(d)
	if d.Labels[vocab.LabelRolledBack] == "2" {
		t.note(t.rolledBack, k, now, nil)
	}
	if l, _ := rollout.ReadLedger(d); l.Newest() != nil && l.Newest().Revision == 2 {
		t.note(t.knownGood, k, now, nil)
	}
}

// note records the first time of k in m, for a Deployment of this bump,
// unless k is in unless already, and ends the wait once every failing one is
// rolled back and every other one known-good.
func (t *timings) note(m map[client.ObjectKey]time.Time, k client.ObjectKey, at time.Time, unless map[client.ObjectKey]time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, ours := t.failing[k]; !ours || t.began.IsZero() {
		return
	}
	if _, after := unless[k]; after {
		return
	}
	if _, seen := m[k]; !seen {
		m[k] = at
	}
	for k, failing := range t.failing {
		if _, ok := t.rolledBack[k]; failing && !ok {
			return
		}
		if _, ok := t.knownGood[k]; !failing && !ok {
			return
		}
	}
	if !t.closed {
		t.closed = true
		close(t.done)
	}
}

func (t *timings) result(r bumped) (bumped, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	var reactions, marked []time.Duration
	var missing []string
	for k, failing := range t.failing {
		switch {
		case failing && !t.rolledBack[k].IsZero() && !t.failed[k].IsZero():
			reactions = append(reactions, t.rolledBack[k].Sub(t.failed[k]))
		case !failing && !t.knownGood[k].IsZero():
			marked = append(marked, t.knownGood[k].Sub(t.began))
		default:
			missing = append(missing, k.String())
		}
	}
	r.Reaction, r.KnownGood = spreadOf(reactions), spreadOf(marked)
	if len(missing) > 0 {
		slices.Sort(missing)
		return r, fmt.Errorf("%d of %d Deployments were not rolled back or marked known-good within 15 min: %v", len(missing), len(t.failing), missing[:min(5, len(missing))])
	}
	return r, nil
}
