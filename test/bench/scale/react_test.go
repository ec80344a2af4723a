package main

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
)

// A watch the API server ends is opened again from the last resourceVersion
// seen, so that nothing in between is missed; after a 410 Gone, from the
// current state.
func TestFollowResumesFromTheLastResourceVersion(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pod := func(rv string) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", ResourceVersion: rv}}
	}
	first, second, third := watch.NewFake(), watch.NewFake(), watch.NewFake()
	opened := make(chan string, 3)
	next := []*watch.FakeWatcher{second, third}
	open := func(rv string) (watch.Interface, error) {
		opened <- rv
		w := next[0]
		next = next[1:]
		return w, nil
	}
	seen := make(chan string, 4)
	done := make(chan struct{})
	go func() {
		defer close(done)
		follow(ctx, "pods", first, open, func(ev watch.Event) { seen <- ev.Object.(*corev1.Pod).ResourceVersion })
	}()

	first.Add(pod("5"))
	first.Modify(pod("7"))
	first.Stop() // the API server ends the watch
	assert.Equal(t, "7", receive(t, opened), "reopened after the last event seen")
	gone := apierrors.NewResourceExpired("too old resource version: 7 (9)").Status()
	gone.Code = http.StatusGone
	second.Error(&gone)
	assert.Equal(t, "", receive(t, opened), "after 410 Gone, from the current state")
	third.Add(pod("12"))
	assert.Equal(t, []string{"5", "7", "12"}, []string{receive(t, seen), receive(t, seen), receive(t, seen)})
	cancel()
	<-done
}

func receive(t *testing.T, c <-chan string) string {
	t.Helper()
	select {
	case v := <-c:
		return v
	case <-time.After(10 * time.Second):
		t.Fatal("nothing within 10 s")
		return ""
	}
}
