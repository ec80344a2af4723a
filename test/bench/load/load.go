// Package load drives admission load through a real kube-apiserver and reads
// what it costs the processes involved, from /proc: the shared parts of
// `make bench-apiserver`, `make bench-scale` and `make bench-reaction`.
package load

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// clockTicks is USER_HZ, the unit of /proc/PID/stat's CPU times: 100 on every
// Linux this project runs on.
const clockTicks = 100

// CPU returns the CPU time (user and system) the process has used so far.
func CPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command name may hold spaces; the fields after it are fixed.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, fmt.Errorf("unreadable /proc/%d/stat", pid)
	}
	f := strings.Fields(string(b[i+1:]))
	// utime and stime are fields 14 and 15 of the whole line, 12 and 13 here.
	if len(f) < 13 {
		return 0, fmt.Errorf("short /proc/%d/stat", pid)
	}
	u, err1 := strconv.ParseInt(f[11], 10, 64)
	s, err2 := strconv.ParseInt(f[12], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, err
	}
	return time.Duration(u+s) * time.Second / clockTicks, nil
}

// RSS returns the process's resident set size in bytes.
func RSS(pid int) (int64, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return kb * 1024, err
		}
	}
	return 0, fmt.Errorf("no VmRSS in /proc/%d/status", pid)
}

// FindProcess returns the pid of the one process whose command line's first
// word ends in name and which mentions every one of marks (a cluster's own
// folder, so that another cluster's process is never taken).
func FindProcess(name string, marks ...string) (int, error) {
	dirs, err := os.ReadDir("/proc")
	if err != nil {
		return 0, err
	}
	var found []int
	for _, d := range dirs {
		pid, err := strconv.Atoi(d.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", d.Name(), "cmdline"))
		if err != nil || len(b) == 0 {
			continue
		}
		args := strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
		if filepath.Base(args[0]) != name {
			continue
		}
		all := strings.Join(args, " ")
		if !slices.ContainsFunc(marks, func(m string) bool { return !strings.Contains(all, m) }) {
			found = append(found, pid)
		}
	}
	if len(found) != 1 {
		return 0, fmt.Errorf("want one %s process mentioning %v, found %d", name, marks, len(found))
	}
	return found[0], nil
}

// Result is what one load run measured.
type Result struct {
	Requests int           `json:"requests"`
	Failed   int           `json:"failed"`
	Elapsed  time.Duration `json:"elapsedNs"`
	PerSec   float64       `json:"requestsPerSecond"`
	P50      time.Duration `json:"p50Ns"`
	P99      time.Duration `json:"p99Ns"`
	// FirstError is the first failure, to say what went wrong.
	FirstError string `json:"firstError,omitempty"`
}

// Run sends requests from clients workers for d (after warmup, whose requests
// are not counted) and returns what they measured. do sends request i of
// worker w.
func Run(ctx context.Context, clients int, warmup, d time.Duration, do func(ctx context.Context, w, i int) error) Result {
	var (
		mu        sync.Mutex
		lat       []time.Duration
		failed    int
		firstErr  string
		measuring atomic.Bool
		wg        sync.WaitGroup
	)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var start time.Time
	for w := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ctx.Err() == nil; i++ {
				t := time.Now()
				err := do(ctx, w, i)
				took := time.Since(t)
				if !measuring.Load() || ctx.Err() != nil {
					continue
				}
				mu.Lock()
				lat = append(lat, took)
				if err != nil {
					failed++
					if firstErr == "" {
						firstErr = err.Error()
					}
				}
				mu.Unlock()
			}
		}()
	}
	sleep(ctx, warmup)
	mu.Lock()
	start = time.Now()
	measuring.Store(true)
	mu.Unlock()
	sleep(ctx, d)
	mu.Lock()
	measuring.Store(false)
	elapsed := time.Since(start)
	mu.Unlock()
	cancel()
	wg.Wait()
	return summarize(lat, failed, firstErr, elapsed)
}

func summarize(lat []time.Duration, failed int, firstErr string, elapsed time.Duration) Result {
	r := Result{Requests: len(lat), Failed: failed, Elapsed: elapsed, FirstError: firstErr}
	if len(lat) == 0 {
		return r
	}
	slices.Sort(lat)
	r.PerSec = float64(len(lat)) / elapsed.Seconds()
	r.P50 = Quantile(lat, 0.50)
	r.P99 = Quantile(lat, 0.99)
	return r
}

// Quantile returns the q-quantile of sorted durations.
func Quantile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	return sorted[min(len(sorted)-1, int(float64(len(sorted))*q))]
}

// Latencies measures n requests, one after another, and returns them sorted
// with the failures: a probe of latency at one size, not of throughput.
func Latencies(ctx context.Context, n int, do func(ctx context.Context, i int) error) ([]time.Duration, int, string) {
	lat := make([]time.Duration, 0, n)
	failed, first := 0, ""
	for i := range n {
		t := time.Now()
		err := do(ctx, i)
		lat = append(lat, time.Since(t))
		if err != nil {
			failed++
			if first == "" {
				first = err.Error()
			}
		}
	}
	slices.Sort(lat)
	return lat, failed, first
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// Millis formats a duration in milliseconds with two decimals.
func Millis(d time.Duration) string {
	return fmt.Sprintf("%.2f ms", float64(d)/float64(time.Millisecond))
}
