// Package health serves the guard's /healthz and /readyz, saying which
// check fails and why.
package health

import (
	"fmt"
	"net"
	"net/http"
	"slices"
	"strings"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/manager"
)

// Probes serves /healthz and /readyz in place of controller-runtime's probe
// server, which withholds every reason: here a failing check says why, and
// ?verbose also shows notes, conditions worth knowing that do not make the
// guard unready (the audit's report CRD missing). The kubelet and a load
// balancer read only the status code.
type Probes struct {
	healthz, readyz []namedCheck
	notes           []namedNote
}

type namedCheck struct {
	name  string
	check healthz.Checker
}

// A note returns "" when it has nothing to say.
type namedNote struct {
	name string
	note func() string
}

// AddHealthzCheck and AddReadyzCheck have the manager's signatures, so that
// setup code registers checks the same way on either.
func (p *Probes) AddHealthzCheck(name string, c healthz.Checker) error {
	p.healthz = append(p.healthz, namedCheck{name, c})
	return nil
}

func (p *Probes) AddReadyzCheck(name string, c healthz.Checker) error {
	p.readyz = append(p.readyz, namedCheck{name, c})
	return nil
}

// AddReadyzNote shows note's text in /readyz?verbose, under name.
func (p *Probes) AddReadyzNote(name string, note func() string) {
	p.notes = append(p.notes, namedNote{name, note})
}

// Server is the probe server for addr, as a manager runnable: it starts with
// the webhooks and stops after them, like the manager's own. The address is
// bound now, so that a port in use fails the start, not a probe later.
func (p *Probes) Server(addr string) (*manager.Server, error) {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listening for health probes on %s: %w", addr, err)
	}
	return &manager.Server{
		Name: "health probe",
		// Whoever reaches the port: a request (a kubelet's probe is a few
		// hundred bytes) is read within 10 s, its headers at most 16 KiB.
		Server: &http.Server{Handler: p.handler(), ReadHeaderTimeout: 10 * time.Second, ReadTimeout: 10 * time.Second,
			MaxHeaderBytes: 16 << 10, IdleTimeout: 90 * time.Second},
		Listener: l,
	}, nil
}

func (p *Probes) handler() http.Handler {
	mux := http.NewServeMux()
	for path, h := range map[string]http.Handler{
		"/healthz": checksHandler{name: "healthz", checks: p.healthz},
		"/readyz":  checksHandler{name: "readyz", checks: p.readyz, notes: p.notes},
	} {
		mux.Handle(path, h)
		mux.Handle(path+"/", http.StripPrefix(path+"/", h))
	}
	return mux
}

// checksHandler answers 200 when every check passes and 500 otherwise, as
// the Kubernetes components do: a line per check with ?verbose or on
// failure, then "<name> check passed" or "<name> check failed". A sub-path
// runs the one check it names.
type checksHandler struct {
	name   string
	checks []namedCheck
	notes  []namedNote
}

func (h checksHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	if one := strings.Trim(r.URL.Path, "/"); one != "" && one != h.name {
		i := slices.IndexFunc(h.checks, func(c namedCheck) bool { return c.name == one })
		if i < 0 {
			http.Error(w, fmt.Sprintf("no %s check named %q", h.name, one), http.StatusNotFound)
			return
		}
		if err := h.checks[i].check(r); err != nil {
			http.Error(w, fmt.Sprintf("%s check failed: %v", one, err), http.StatusInternalServerError)
			return
		}
		fmt.Fprint(w, "ok")
		return
	}
	_, verbose := r.URL.Query()["verbose"]
	var b strings.Builder
	failed := false
	for _, c := range h.checks {
		if err := c.check(r); err != nil {
			failed = true
			fmt.Fprintf(&b, "[-]%s failed: %v\n", c.name, err)
		} else {
			fmt.Fprintf(&b, "[+]%s ok\n", c.name)
		}
	}
	for _, n := range h.notes {
		if text := n.note(); text != "" {
			fmt.Fprintf(&b, "[+]%s ok, note: %s\n", n.name, text)
		}
	}
	if failed {
		w.WriteHeader(http.StatusInternalServerError)
		fmt.Fprintf(w, "%s%s check failed\n", b.String(), h.name)
		return
	}
	if !verbose {
		fmt.Fprint(w, "ok")
		return
	}
	fmt.Fprintf(w, "%s%s check passed\n", b.String(), h.name)
}
