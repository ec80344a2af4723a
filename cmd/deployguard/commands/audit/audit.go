// Package audit is `deployguard audit`: what the guard's background audit
// found in the cluster, and the PolicyExceptions with what they cover.
package audit

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deployguard/deployguard/cmd/deployguard/cli"
	guardaudit "github.com/deployguard/deployguard/webhook/audit"
	"github.com/deployguard/deployguard/webhook/exception"
)

// Run is `deployguard audit [-n NS] [-o text|json]`: what the audit's
// reports say, grouped by policy then namespace.
func Run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("deployguard audit", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), `Usage: deployguard audit [flags]

Prints what the guard's audit reports say about the Deployments already in
the cluster, by policy then namespace: which would be refused if the policy
were enforced, which warn, which could not be evaluated. Then the
PolicyExceptions: which are active, when each expires, who owns it, and the
Deployments it covers now.

Flags:
`)
		fs.PrintDefaults()
	}
	kubeconfig := fs.String("kubeconfig", "", "path of a kubeconfig; in-cluster configuration or $KUBECONFIG when empty")
	namespace := fs.String("n", "", "only this namespace's report; every namespace when empty")
	output := fs.String("o", "text", "output format: text or json")
	format := fs.String("format", guardaudit.FormatPolicyReport, "the report kind the guard writes (its config's audit.reportFormat)")
	exceptionsNS := fs.String("exceptions-namespace", "deployguard-system", "where the guard honours PolicyExceptions (its config's exceptions.namespace)")
	expiryWarning := fs.Duration("expiry-warning", 7*24*time.Hour, "an exception this close to its expiry is listed as expiring (the config's exceptions.expiryWarning)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	gvk, err := guardaudit.GVK(*format)
	if fs.NArg() > 0 || (*output != "text" && *output != "json") || err != nil {
		fmt.Fprintln(stderr, "deployguard audit: takes no arguments, -o text or -o json, and -format", guardaudit.FormatPolicyReport, "or", guardaudit.FormatOpenReports)
		fs.Usage()
		return 2
	}
	c, err := cli.NewClient(*kubeconfig)
	if err != nil {
		fmt.Fprintf(stderr, "deployguard audit: %v\n", err)
		return 1
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	list := &unstructured.UnstructuredList{}
	list.SetGroupVersionKind(gvk.GroupVersion().WithKind(gvk.Kind + "List"))
	opts := []client.ListOption{client.MatchingLabels{"app.kubernetes.io/managed-by": "deployguard"}}
	if *namespace != "" {
		opts = append(opts, client.InNamespace(*namespace))
	}
	if err := c.List(ctx, list, opts...); err != nil {
		fmt.Fprintf(stderr, "deployguard audit: listing %s reports: %v\n", gvk.Kind, err)
		return 1
	}
	var reports []guardaudit.Stored
	for i := range list.Items {
		if list.Items[i].GetName() == guardaudit.ReportName {
			reports = append(reports, guardaudit.Parse(&list.Items[i]))
		}
	}
	o := auditOutput{Overview: guardaudit.OverviewOf(reports)}
	covered, served, err := exceptionCoverage(ctx, c, *exceptionsNS, *namespace, *expiryWarning)
	if err != nil {
		fmt.Fprintf(stderr, "deployguard audit: %v\n", err)
		return 1
	}
	if served {
		o.Exceptions = &covered
	}
	if *output == "json" {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		enc.SetEscapeHTML(false)
		_ = enc.Encode(o)
		return 0
	}
	o.WriteText(stdout)
	if served {
		fmt.Fprintln(stdout)
		exception.WriteCoverage(stdout, covered, time.Now())
	}
	return 0
}

// auditOutput is the reports' overview and, where the API is served, the
// PolicyExceptions with what they cover.
type auditOutput struct {
	guardaudit.Overview
	Exceptions *[]exception.Covered `json:"exceptions,omitempty"`
}
