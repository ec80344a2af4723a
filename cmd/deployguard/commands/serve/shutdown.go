package serve

import (
	"context"
	"errors"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
)

// errShuttingDown is /readyz's answer once the guard has been told to stop.
var errShuttingDown = errors.New("shutting down: no new admission requests, please")

// gracefulStop turns the stop signal into a stop in two steps. First /readyz
// fails, while the webhooks keep serving for delay: the Service's endpoints
// (or a load balancer's health check) stop sending requests in that time.
// Then the returned context ends, and the manager stops its webhook server
// gracefully, finishing the requests in flight. Without the delay, requests
// sent between the signal and the endpoint update would fail, and the API
// server does not retry a webhook call.
type gracefulStop struct {
	stopping atomic.Bool
}

// Check is the readiness check: ready until the stop signal.
func (g *gracefulStop) Check(*http.Request) error {
	if g.stopping.Load() {
		return errShuttingDown
	}
	return nil
}

// after returns a context that ends delay after signal ends.
func (g *gracefulStop) after(signal context.Context, delay time.Duration, log logr.Logger) context.Context {
	ctx, cancel := context.WithCancel(context.WithoutCancel(signal))
	go func() {
		<-signal.Done()
		g.stopping.Store(true)
		log.Info("Stop signal received: not ready any more, serving until the endpoints drop this replica", "delay", delay.String())
		time.Sleep(delay)
		cancel()
	}()
	return ctx
}
