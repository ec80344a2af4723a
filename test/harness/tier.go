package harness

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/stretchr/testify/require"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
)

// TierOptions describe a test tier's TestMain: what it needs on disk and
// what it starts before its tests run.
type TierOptions struct {
	// Name names the tier's work folder (deployguard-NAME-…), its log
	// (NAME.log) and its local cluster (dg-NAME-PID).
	Name string
	// Tools are the control-plane binaries the tier runs, as ToolsDir takes
	// them; none named: the whole control plane.
	Tools []string
	// WithoutGuard is set by a tier that never runs the deployguard binary.
	WithoutGuard bool
	// Local, when set, starts one local cluster with the guard for all the
	// tier's tests, within 5 minutes. RunTier fills in its Tools, Guard,
	// Name, WorkDir and Log.
	Local *LocalOptions
	// Logger is controller-runtime's logger (the test clients' own log, where
	// the warnings the API server relays end up), given the tier's log; nil:
	// into the tier's log.
	Logger func(log io.Writer) logr.Logger
	// WorkDir, when set, is a fixed folder for the tier's work, emptied first
	// and kept after the run: for a tier whose output is its report. Unset: a
	// new temporary folder, removed when every test passed.
	WorkDir string
	// Setup runs once the local cluster, if any, is up, before the tests.
	// ctx ends when the tests are done (a wait in Setup sets its own
	// deadline); what it registers with Tier.Cleanup runs after the tests,
	// the last registered first.
	Setup func(ctx context.Context, tier *Tier) error
}

// Tier is what RunTier prepared for a tier's tests.
type Tier struct {
	Name  string
	Tools string // the control plane's folder
	Guard string // the deployguard binary ("" WithoutGuard)
	// WorkDir holds the tier's log, its cluster's state and the tests' own
	// folders (TestWorkDir).
	WorkDir string
	Log     *os.File
	// Local is the tier's local cluster with the guard, when it asked for one.
	Local *Local

	cleanups []func()
}

// Cleanup registers f to run after the tier's tests, before its local
// cluster stops; the last registered runs first.
func (tier *Tier) Cleanup(f func()) { tier.cleanups = append(tier.cleanups, f) }

// RunTier is a tier's TestMain: `os.Exit(harness.RunTier(m, opts))`. It finds
// the control plane and the guard binary (an error with the command to run
// when one is missing: a tier never skips), creates the work folder and the
// log, points controller-runtime's logger at it, starts the local cluster
// when asked, runs Setup and the tests, and stops everything. When a test
// fails, or the start does, it keeps the work folder and prints the end of
// the log.
func RunTier(m *testing.M, o TierOptions) int {
	tier, err := newTier(o)
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s tier: %v\n", o.Name, err)
		return 1
	}
	code := tier.run(m, o)
	for i := len(tier.cleanups) - 1; i >= 0; i-- {
		tier.cleanups[i]()
	}
	if tier.Local != nil {
		tier.Local.Stop()
	}
	_ = tier.Log.Close()
	switch {
	case code != 0:
		if fi, err := os.Stat(tier.Log.Name()); err == nil && fi.Size() == 0 {
			fmt.Fprintf(os.Stderr, "the %s tier's work folder is kept: %s\n", o.Name, tier.WorkDir)
			break
		}
		fmt.Fprintf(os.Stderr, "--- end of the %s tier's log (%s; the work folder is kept) ---\n%s\n", o.Name, tier.Log.Name(), TailFile(tier.Log.Name(), tierLogTail))
	case o.WorkDir == "":
		_ = os.RemoveAll(tier.WorkDir)
	}
	return code
}

// tierLogTail is how much of a log a failure prints.
const tierLogTail = 12000

func newTier(o TierOptions) (*Tier, error) {
	tier := &Tier{Name: o.Name}
	var err error
	if tier.Tools, err = ToolsDir(o.Tools...); err != nil {
		return nil, err
	}
	if !o.WithoutGuard {
		if tier.Guard, err = GuardBinary(); err != nil {
			return nil, err
		}
	}
	if o.WorkDir != "" {
		tier.WorkDir = o.WorkDir
		if err := os.RemoveAll(tier.WorkDir); err != nil {
			return nil, err
		}
		err = os.MkdirAll(tier.WorkDir, 0o755)
	} else {
		tier.WorkDir, err = os.MkdirTemp("", "deployguard-"+o.Name+"-")
	}
	if err != nil {
		return nil, err
	}
	if tier.Log, err = os.Create(filepath.Join(tier.WorkDir, o.Name+".log")); err != nil {
		return nil, err
	}
	logger := zap.New(zap.WriteTo(tier.Log))
	if o.Logger != nil {
		logger = o.Logger(tier.Log)
	}
	ctrl.SetLogger(logger)
	return tier, nil
}

// run starts what the tier asked for and runs its tests.
func (tier *Tier) run(m *testing.M, o TierOptions) int {
	if o.Local != nil {
		lo := *o.Local
		lo.Tools, lo.Guard, lo.Name, lo.WorkDir, lo.Log = tier.Tools, tier.Guard, fmt.Sprintf("dg-%s-%d", o.Name, os.Getpid()), tier.WorkDir, tier.Log
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		l, err := StartLocal(ctx, lo)
		cancel()
		if err != nil {
			fmt.Fprintf(os.Stderr, "starting the local cluster: %v\n", err)
			return 1
		}
		tier.Local = l
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if o.Setup != nil {
		if err := o.Setup(ctx, tier); err != nil {
			fmt.Fprintf(os.Stderr, "setting up the %s tier: %v\n", o.Name, err)
			return 1
		}
	}
	return m.Run()
}

// TestWorkDir is a folder of the test's own in the tier's work folder, with
// a log file in it, for a test that starts a cluster or guards of its own.
// When the test passes, the folder is removed; when it fails, it is kept and
// the end of the log goes to the test's output.
func (tier *Tier) TestWorkDir(t *testing.T) (string, *os.File) {
	t.Helper()
	dir, err := os.MkdirTemp(tier.WorkDir, dnsLabel(t.Name(), 40)+"-")
	require.NoError(t, err, "creating the test's work folder")
	log, err := os.Create(filepath.Join(dir, "test.log"))
	require.NoError(t, err, "creating the test's log")
	t.Cleanup(func() {
		_ = log.Close()
		if t.Failed() {
			t.Logf("work folder kept: %s\n--- end of %s ---\n%s", dir, log.Name(), TailFile(log.Name(), 15000))
			return
		}
		_ = os.RemoveAll(dir)
	})
	return dir, log
}

// TailFile is the end of a file, up to n bytes, for a failure's report; the
// error's text when it cannot be read.
func TailFile(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}

var notInLabel = regexp.MustCompile(`[^a-z0-9-]+`)

// dnsLabel turns s (a test's name) into the start of a DNS label of at most
// n characters: lower case, runs of other characters as one hyphen.
func dnsLabel(s string, n int) string {
	s = notInLabel.ReplaceAllString(strings.ToLower(s), "-")
	s = strings.Trim(s, "-")
	if len(s) > n {
		s = strings.TrimRight(s[:n], "-")
	}
	if s == "" {
		return "test"
	}
	return s
}
