package rollout

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"
	appsv1 "k8s.io/api/apps/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deployguard/deployguard/cmd/deployguard/cli"
	"github.com/deployguard/deployguard/reconciler"
)

// Exit codes of `deployguard rollout status`.
const (
	rolloutExitComplete = 0
	// rolloutExitFailed: the rollout failed (rolled back, found failing,
	// past its deadline) or did not finish within --timeout.
	rolloutExitFailed = 1
	rolloutExitUsage  = 2
	// rolloutExitUnknown: the Deployment could not be read.
	rolloutExitUnknown = 3
)

// rolloutPollInterval is how often the rollout is read again. The guard's
// verdict stays on the Deployment after a rollback, so a poll misses
// nothing that a watch would see.
const rolloutPollInterval = time.Second

// rolloutReport is the JSON of `rollout status -o json`.
type rolloutReport struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	reconciler.RolloutState
	TimedOut bool `json:"timedOut,omitempty"`
}

// NewCommand is `deployguard rollout` with its one verb, `status`.
func NewCommand(s cli.Streams) *cobra.Command {
	cmd := cli.NewCommand(s, &cobra.Command{
		Use:   "rollout",
		Short: "wait for a rollout like kubectl, and fail when the guard rolled it back (CI/CD)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return cli.Usage(cmd, "give a verb: status")
		},
	})
	cmd.AddCommand(newStatusCommand(s))
	return cmd
}

// newStatusCommand is `deployguard rollout status` (`kubectl deployguard
// rollout status`), a drop-in for `kubectl rollout status` that also fails
// when the guard rolled the revision back or found it failing.
func newStatusCommand(s cli.Streams) *cobra.Command {
	var (
		timeout time.Duration
		output  string
	)
	cluster := cli.NewCluster()
	cmd := cli.NewClusterCommand(s, cluster, &cobra.Command{
		Use:   "status [flags] [deployment/]NAME",
		Short: "wait for a rollout, and fail when it did not succeed in the guard's words",
		Long: `Waits for the rollout of a Deployment to finish, as kubectl rollout status
does, and fails (exit 1) when it did not succeed, in deployguard's words:
the guard rolled the revision back, or found it failing and left it, or it
exceeded its progress deadline. After a rollback upstream's status reads as
a success; this command still fails until a new template is applied or the
rollback is accepted.

Exit codes: 0 rolled out, 1 failed or timed out, 2 usage, 3 could not read
the Deployment.`,
		Example: `  kubectl deployguard rollout status deploy/web -n shop --timeout=5m`,
		ValidArgsFunction: func(cmd *cobra.Command, args []string, toComplete string) ([]string, cobra.ShellCompDirective) {
			// NAME, or TYPE/NAME as kubectl writes it.
			kind, name, typed := strings.Cut(toComplete, "/")
			if !typed {
				return cluster.CompleteDeployment(cmd, args, toComplete)
			}
			names, d := cluster.CompleteDeployment(cmd, args, name)
			for i := range names {
				names[i] = kind + "/" + names[i]
			}
			return names, d
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			name, ok := deploymentName(args)
			if !ok || (output != "text" && output != "json") {
				fmt.Fprintln(s.ErrOut, "deployguard rollout status: give exactly one deployment/NAME (or NAME), and -o text or -o json")
				fmt.Fprintf(s.ErrOut, "Usage: %s\n", cmd.UseLine())
				return cli.Exit(rolloutExitUsage)
			}
			return cli.Exit(runStatus(cluster, name, timeout, output, s))
		},
	})
	cmd.Flags().DurationVar(&timeout, "timeout", 0, "how long to wait before giving up (exit 1); 0 waits for ever")
	cmd.Flags().StringVarP(&output, "output", "o", "text", "output format: text, or json (one object at the end)")
	cli.CompleteWords(cmd, "output", "text", "json")
	return cmd
}

func runStatus(cluster *cli.Cluster, name string, timeout time.Duration, output string, s cli.Streams) int {
	ns, _, err := cluster.Namespace()
	if err != nil {
		fmt.Fprintf(s.ErrOut, "deployguard rollout status: %v\n", err)
		return rolloutExitUnknown
	}
	c, err := cluster.Client()
	if err != nil {
		fmt.Fprintf(s.ErrOut, "deployguard rollout status: %v\n", err)
		return rolloutExitUnknown
	}
	ctx := context.Background()
	if timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	rep, err := waitForRollout(ctx, c, ns, name, func(st reconciler.RolloutState) {
		if output == "text" {
			fmt.Fprintln(s.Out, st.Message)
		}
	})
	switch {
	case err != nil && !rep.TimedOut:
		fmt.Fprintf(s.ErrOut, "deployguard rollout status: %v\n", err)
		return rolloutExitUnknown
	case output == "json":
		cli.WriteJSON(s.Out, rep)
	case rep.TimedOut:
		fmt.Fprintf(s.ErrOut, "error: timed out waiting for deployment %q: %s\n", name, rep.Message)
	case rep.Phase == reconciler.RolloutFailed:
		fmt.Fprintf(s.ErrOut, "error: deployment %q rollout failed (%s): %s\n", name, rep.Reason, rep.Message)
	}
	if rep.Phase == reconciler.RolloutComplete {
		return rolloutExitComplete
	}
	return rolloutExitFailed
}

// waitForRollout reads the rollout until it completes or fails, or ctx ends
// (TimedOut). progress is told each new waiting message, and the last one.
// A read that fails for a passing reason is tried again; a Deployment not
// found is an error.
func waitForRollout(ctx context.Context, c client.Reader, ns, name string, progress func(reconciler.RolloutState)) (rolloutReport, error) {
	rep := rolloutReport{Namespace: ns, Name: name}
	last := ""
	var lastErr error
	for {
		st, err := readRollout(ctx, c, ns, name)
		switch {
		case apierrors.IsNotFound(err):
			return rep, fmt.Errorf("deployment %q not found in namespace %q", name, ns)
		case err != nil:
			lastErr = err
		default:
			lastErr = nil
			rep.RolloutState = st
			if st.Message != last {
				progress(st)
				last = st.Message
			}
			if st.Phase != reconciler.RolloutProgressing {
				return rep, nil
			}
		}
		select {
		case <-ctx.Done():
			rep.TimedOut = true
			if lastErr != nil {
				return rep, lastErr
			}
			return rep, ctx.Err()
		case <-time.After(rolloutPollInterval):
		}
	}
}

// readRollout reads the Deployment and the ReplicaSets it controls, and
// decides its rollout's state.
func readRollout(ctx context.Context, c client.Reader, ns, name string) (reconciler.RolloutState, error) {
	d := &appsv1.Deployment{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, d); err != nil {
		return reconciler.RolloutState{}, err
	}
	sel, err := metav1.LabelSelectorAsSelector(d.Spec.Selector)
	if err != nil {
		return reconciler.RolloutState{}, fmt.Errorf("deployment %q: selector: %w", name, err)
	}
	var list appsv1.ReplicaSetList
	if err := c.List(ctx, &list, client.InNamespace(ns), client.MatchingLabelsSelector{Selector: sel}); err != nil {
		return reconciler.RolloutState{}, fmt.Errorf("listing the ReplicaSets of deployment %q: %w", name, err)
	}
	var rss []*appsv1.ReplicaSet
	for i := range list.Items {
		if metav1.IsControlledBy(&list.Items[i], d) {
			rss = append(rss, &list.Items[i])
		}
	}
	return reconciler.ReadRollout(d, rss), nil
}

// deploymentName parses kubectl's forms of the one argument: NAME,
// deployment/NAME, deploy/NAME, deployments/NAME, deployment.apps/NAME.
func deploymentName(args []string) (string, bool) {
	if len(args) != 1 {
		return "", false
	}
	kind, name, ok := strings.Cut(args[0], "/")
	if !ok {
		return args[0], args[0] != ""
	}
	switch strings.ToLower(kind) {
	case "deployment", "deployments", "deploy", "deployment.apps", "deployments.apps":
		return name, name != "" && !strings.Contains(name, "/")
	}
	return "", false
}
