// Package audit is `deployguard audit`: what the guard's background audit
// found in the cluster, and the PolicyExceptions with what they cover.
package audit

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deployguard/deployguard/cmd/deployguard/cli"
	guardaudit "github.com/deployguard/deployguard/webhook/audit"
	"github.com/deployguard/deployguard/webhook/exception"
)

// NewCommand is `deployguard audit [-n NS] [-o text|json]`: what the
// audit's reports say, grouped by policy then namespace.
func NewCommand(s cli.Streams) *cobra.Command {
	var (
		output, format, exceptionsNS string
		expiryWarning                time.Duration
	)
	cluster := cli.NewCluster()
	cmd := cli.NewClusterCommand(s, cluster, &cobra.Command{
		Use:   "audit [flags]",
		Short: "what the background audit found in existing Deployments, by policy then namespace",
		Long: `Prints what the guard's audit reports say about the Deployments already in
the cluster, by policy then namespace: which would be refused if the policy
were enforced, which warn, which could not be evaluated. Then the
PolicyExceptions: which are active, when each expires, who owns it, and the
Deployments it covers now.

Every namespace's report, unless -n names one.`,
		ValidArgsFunction: cobra.NoFileCompletions,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) > 0 {
				return cli.Usage(cmd, "takes no arguments")
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, _ []string) error {
			gvk, err := guardaudit.GVK(format)
			if (output != "text" && output != "json") || err != nil {
				return cli.Usage(cmd, fmt.Sprintf("-o is text or json, and --format %s or %s", guardaudit.FormatPolicyReport, guardaudit.FormatOpenReports))
			}
			namespace := ""
			if ns, given, err := cluster.Namespace(); err == nil && given {
				namespace = ns
			}
			return cluster.Do(cmd, time.Minute, func(ctx context.Context, c client.Client) error {
				return run(ctx, c, gvk, namespace, output, exceptionsNS, expiryWarning, s.Out)
			})
		},
	})
	cmd.Flags().StringVarP(&output, "output", "o", "text", "output format: text or json")
	cmd.Flags().StringVar(&format, "format", guardaudit.FormatPolicyReport, "the report kind the guard writes (its config's audit.reportFormat)")
	cmd.Flags().StringVar(&exceptionsNS, "exceptions-namespace", "deployguard-system", "where the guard honours PolicyExceptions (its config's exceptions.namespace)")
	cmd.Flags().DurationVar(&expiryWarning, "expiry-warning", 7*24*time.Hour, "an exception this close to its expiry is listed as expiring (the config's exceptions.expiryWarning)")
	cli.CompleteWords(cmd, "output", "text", "json")
	cli.CompleteWords(cmd, "format", guardaudit.FormatPolicyReport, guardaudit.FormatOpenReports)
	return cmd
}

// run lists the reports and the exceptions, and writes what they say.
func run(ctx context.Context, c client.Client, gvk schema.GroupVersionKind, namespace, output, exceptionsNS string, expiryWarning time.Duration, stdout io.Writer) error {
	list := &unstructured.UnstructuredList{}
	list.SetGroupVersionKind(gvk.GroupVersion().WithKind(gvk.Kind + "List"))
	opts := []client.ListOption{client.MatchingLabels{"app.kubernetes.io/managed-by": "deployguard"}}
	if namespace != "" {
		opts = append(opts, client.InNamespace(namespace))
	}
	if err := c.List(ctx, list, opts...); err != nil {
		return fmt.Errorf("listing %s reports: %w", gvk.Kind, err)
	}
	var reports []guardaudit.Stored
	for i := range list.Items {
		if list.Items[i].GetName() == guardaudit.ReportName {
			reports = append(reports, guardaudit.Parse(&list.Items[i]))
		}
	}
	o := auditOutput{Overview: guardaudit.OverviewOf(reports)}
	covered, served, err := exceptionCoverage(ctx, c, exceptionsNS, namespace, expiryWarning)
	if err != nil {
		return err
	}
	if served {
		o.Exceptions = &covered
	}
	if output == "json" {
		cli.WriteJSON(stdout, o)
		return nil
	}
	o.WriteText(stdout)
	if served {
		fmt.Fprintln(stdout)
		exception.WriteCoverage(stdout, covered, time.Now())
	}
	return nil
}

// auditOutput is the reports' overview and, where the API is served, the
// PolicyExceptions with what they cover.
type auditOutput struct {
	guardaudit.Overview
	Exceptions *[]exception.Covered `json:"exceptions,omitempty"`
}
