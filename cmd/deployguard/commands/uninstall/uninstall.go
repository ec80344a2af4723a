package uninstall

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deployguard/deployguard/cmd/deployguard/cli"
	"github.com/deployguard/deployguard/reconciler"
	"github.com/deployguard/deployguard/reconciler/vocab"
)

// uninstallOptions are the flags of `deployguard uninstall`.
type uninstallOptions struct {
	mutatingName   string
	validatingName string
	dryRun         bool
}

// Run is `deployguard uninstall`: it takes the guard out of the cluster's
// way, so that every Deployment can be deleted without it.
func Run(args []string, stdout, stderr io.Writer) int {
	o := uninstallOptions{}
	fs := flag.NewFlagSet("deployguard uninstall", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), `Usage: deployguard uninstall [flags]

Removes the guard's webhook configurations first (so nothing adds or defends the
guard's finalizers any more), then removes the guard's finalizers, and only
those, from every Deployment in the cluster. Run it before deleting the guard
itself. Record ConfigMaps of deleted Deployments are kept, and so are the
CRDs with their objects (PolicyExceptions, reports): deleting a CRD deletes
every object of its kind, so that is left to kubectl delete crd.

Flags:
`)
		fs.PrintDefaults()
	}
	kubeconfig := fs.String("kubeconfig", "", "path of a kubeconfig; in-cluster configuration or $KUBECONFIG when empty")
	fs.StringVar(&o.mutatingName, "mutating-webhook-configuration", "deployguard-mutating", "the guard's MutatingWebhookConfiguration")
	fs.StringVar(&o.validatingName, "validating-webhook-configuration", "deployguard-validating", "the guard's ValidatingWebhookConfiguration")
	fs.BoolVar(&o.dryRun, "dry-run", false, "only list what would be removed")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "deployguard uninstall: unexpected arguments %v\n", fs.Args())
		return 2
	}
	c, err := cli.NewClient(*kubeconfig)
	if err != nil {
		fmt.Fprintf(stderr, "deployguard uninstall: %v\n", err)
		return 1
	}
	ctx, cancel := context.WithTimeout(context.Background(), cli.Timeout)
	defer cancel()
	if err := uninstallGuard(ctx, c, o, stdout); err != nil {
		fmt.Fprintf(stderr, "deployguard uninstall: %v\n", err)
		return 1
	}
	return 0
}

// uninstallGuard removes the webhook configurations, then the guard's
// finalizers from every Deployment, and prints what it did. The order
// matters: while the validating webhook is there, it refuses the removal of the
// guard's finalizers by anyone but the guard, and the mutating webhook adds
// them to Deployments that have none. A failure on one Deployment does not stop
// the others; the failures are returned together.
func uninstallGuard(ctx context.Context, c client.Client, o uninstallOptions, out io.Writer) error {
	deleted := "deleted"
	if o.dryRun {
		deleted = "would delete"
	}
	hooks := []client.Object{
		&admissionregistrationv1.MutatingWebhookConfiguration{},
		&admissionregistrationv1.ValidatingWebhookConfiguration{},
	}
	hooks[0].SetName(o.mutatingName)
	hooks[1].SetName(o.validatingName)
	for _, h := range hooks {
		kind := "mutatingwebhookconfiguration"
		if _, ok := h.(*admissionregistrationv1.ValidatingWebhookConfiguration); ok {
			kind = "validatingwebhookconfiguration"
		}
		var err error
		if o.dryRun {
			err = c.Get(ctx, client.ObjectKeyFromObject(h), h)
		} else {
			err = c.Delete(ctx, h)
		}
		switch {
		case apierrors.IsNotFound(err):
			fmt.Fprintf(out, "%s/%s not found (already removed)\n", kind, h.GetName())
		case err != nil:
			// The finalizers must not go while the webhooks still guard them.
			return fmt.Errorf("removing %s/%s (nothing else was changed): %w", kind, h.GetName(), err)
		default:
			fmt.Fprintf(out, "%s %s/%s\n", deleted, kind, h.GetName())
		}
	}

	var (
		seen, changed int
		errs          []error
	)
	list := &appsv1.DeploymentList{}
	opts := []client.ListOption{client.Limit(500)}
	for {
		if err := c.List(ctx, list, opts...); err != nil {
			return errors.Join(append(errs, fmt.Errorf("listing Deployments: %w", err))...)
		}
		for i := range list.Items {
			d := &list.Items[i]
			if !slices.ContainsFunc(d.Finalizers, vocab.IsGuardFinalizer) {
				continue
			}
			seen++
			if o.dryRun {
				fmt.Fprintf(out, "would remove finalizers %v from deployment %s/%s%s\n", guardFinalizersOf(d), d.Namespace, d.Name, deletingNote(d))
				continue
			}
			removed, err := removeGuardFinalizers(ctx, c, client.ObjectKeyFromObject(d))
			if err != nil {
				errs = append(errs, fmt.Errorf("deployment %s/%s: %w", d.Namespace, d.Name, err))
				continue
			}
			if len(removed) > 0 {
				changed++
				fmt.Fprintf(out, "removed finalizers %v from deployment %s/%s%s\n", removed, d.Namespace, d.Name, deletingNote(d))
			}
		}
		if list.Continue == "" {
			break
		}
		opts = []client.ListOption{client.Limit(500), client.Continue(list.Continue)}
	}
	if o.dryRun {
		fmt.Fprintf(out, "%d Deployments carry the guard's finalizers; nothing was changed (dry run).\n", seen)
	} else {
		fmt.Fprintf(out, "Removed the guard's finalizers from %d Deployments.\n", changed)
	}
	fmt.Fprintf(out, "Records of deleted Deployments are kept: kubectl get configmaps -A -l %s=true\n", vocab.LabelRecord)
	return errors.Join(errs...)
}

// removeGuardFinalizers removes the guard's finalizers, and only those, from
// one Deployment: a patch conditional on the resourceVersion read, read again
// and retried on conflict. It returns the finalizers removed (none if the
// Deployment is gone or has none left).
func removeGuardFinalizers(ctx context.Context, c client.Client, key client.ObjectKey) ([]string, error) {
	var removed []string
	err := retry.RetryOnConflict(retry.DefaultBackoff, func() error {
		removed = nil
		d := &appsv1.Deployment{}
		if err := c.Get(ctx, key, d); err != nil {
			if apierrors.IsNotFound(err) {
				return nil
			}
			return err
		}
		mine := guardFinalizersOf(d)
		if len(mine) == 0 {
			return nil
		}
		patch := client.MergeFromWithOptions(d.DeepCopy(), client.MergeFromWithOptimisticLock{})
		d.Finalizers = reconciler.WithoutGuardFinalizers(d.Finalizers)
		if err := c.Patch(ctx, d, patch); err != nil {
			if apierrors.IsNotFound(err) {
				return nil
			}
			return err
		}
		removed = mine
		return nil
	})
	return removed, err
}

func guardFinalizersOf(d *appsv1.Deployment) []string {
	return slices.DeleteFunc(slices.Clone(d.Finalizers), func(f string) bool { return !vocab.IsGuardFinalizer(f) })
}

func deletingNote(d *appsv1.Deployment) string {
	if d.DeletionTimestamp != nil {
		return " (being deleted: it goes once they are removed)"
	}
	return ""
}
