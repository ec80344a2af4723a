package uninstall

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/spf13/cobra"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deployguard/deployguard/cmd/deployguard/cli"
	nativeconfig "github.com/deployguard/deployguard/config/native"
	"github.com/deployguard/deployguard/reconciler"
	"github.com/deployguard/deployguard/reconciler/rollout"
	"github.com/deployguard/deployguard/reconciler/vocab"
	"github.com/deployguard/deployguard/webhook/native"
)

// uninstallOptions are the flags of `deployguard uninstall`.
type uninstallOptions struct {
	// cluster is the cluster to uninstall from, as kubectl's flags name it.
	cluster        *cli.Cluster
	mutatingName   string
	validatingName string
	namespace      string
	dryRun         bool
}

// NewCommand is `deployguard uninstall`: it takes the guard out of the
// cluster's way, so that every Deployment can be deleted without it.
func NewCommand(s cli.Streams) *cobra.Command {
	o := uninstallOptions{cluster: cli.NewCluster()}
	cmd := cli.NewClusterCommand(s, o.cluster, &cobra.Command{
		Use:   "uninstall [flags]",
		Short: "remove the webhooks, then the guard's finalizers from every Deployment",
		Long: `Removes the guard's webhook configurations and native policies (with their
bindings and params) first, so nothing adds or defends the guard's finalizers
any more, then removes the guard's finalizers, and only
those, from every Deployment in the cluster, and ends the guard's rollback
verdicts (its Stalled condition, label and annotation), which nothing would
end once it is gone, and removes its ledgers. Last, it deletes the ConfigMap
deployguard-ledger, so that a guard installed again adopts no earlier
release's annotations (a tenant may have written them). Run it before
deleting the guard itself. Record ConfigMaps of deleted Deployments are kept, in the guard's
namespace (-n/--namespace, deployguard-system unless given): they go when
that namespace is deleted, so save them first if you may want them back.
The CRDs are kept with their objects (PolicyExceptions, reports): deleting
a CRD deletes every object of its kind, so that is left to kubectl delete crd.`,
		Example: `  kubectl deployguard uninstall --dry-run
  kubectl deployguard uninstall -n deployguard-system`,
		ValidArgsFunction: cobra.NoFileCompletions,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) > 0 {
				return cli.Usage(cmd, fmt.Sprintf("unexpected arguments %v", args))
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, _ []string) error {
			// -n is the guard's namespace here, not the kubeconfig context's.
			o.namespace = defaultGuardNamespace
			if ns, given, err := o.cluster.Namespace(); err == nil && given {
				o.namespace = ns
			}
			return o.cluster.Do(cmd, cli.Timeout, func(ctx context.Context, c client.Client) error {
				return uninstallGuard(ctx, c, o, s.Out)
			})
		},
	})
	cmd.Flags().StringVar(&o.mutatingName, "mutating-webhook-configuration", "deployguard-mutating", "the guard's MutatingWebhookConfiguration")
	cmd.Flags().StringVar(&o.validatingName, "validating-webhook-configuration", "deployguard-validating", "the guard's ValidatingWebhookConfiguration")
	cmd.Flags().BoolVar(&o.dryRun, "dry-run", false, "only list what would be removed")
	cmd.Flags().Lookup("namespace").Usage = "the guard's namespace (default " + defaultGuardNamespace + "), which holds the native policies' params and the records of deleted Deployments"
	return cmd
}

// defaultGuardNamespace is the guard's namespace of a default install.
const defaultGuardNamespace = "deployguard-system"

// endMark ends one of the guard's marks on d with end (which reports
// whether there was one left to end), or, in a dry run, says it would: 1
// when it ended one or would have.
func endMark(dryRun bool, out io.Writer, d *appsv1.Deployment, would, did string, end func() (bool, error)) (int, error) {
	if dryRun {
		fmt.Fprintf(out, "would %s deployment %s/%s\n", would, d.Namespace, d.Name)
		return 1, nil
	}
	ended, err := end()
	switch {
	case err != nil:
		return 0, fmt.Errorf("deployment %s/%s: %s: %w", d.Namespace, d.Name, strings.TrimSuffix(strings.TrimSuffix(would, " on"), " from"), err)
	case ended:
		fmt.Fprintf(out, "%s deployment %s/%s\n", did, d.Namespace, d.Name)
		return 1, nil
	}
	return 0, nil
}

// admissionObject is one of the guard's admission objects, by kind.
type admissionObject struct {
	kind string
	obj  client.Object
}

// admissionObjects are what admits Deployments on the guard's behalf: its
// webhook configurations, its native policies and their bindings (bindings
// first: a binding without its policy is an error the API server reports;
// the mutating policy first: see below), and the policies' params.
func admissionObjects(o uninstallOptions) ([]admissionObject, error) {
	m := &admissionregistrationv1.MutatingWebhookConfiguration{}
	m.SetName(o.mutatingName)
	v := &admissionregistrationv1.ValidatingWebhookConfiguration{}
	v.SetName(o.validatingName)
	out := []admissionObject{{"mutatingwebhookconfiguration", m}, {"validatingwebhookconfiguration", v}}
	rules, err := native.Load()
	if err != nil {
		return nil, err
	}
	// The selector repair before the refusals: without them, the marker it
	// leaves on an unrepairable selector would be admitted.
	for _, p := range rules.Mutations {
		b := &admissionregistrationv1.MutatingAdmissionPolicyBinding{}
		b.SetName(p.Name)
		out = append(out, admissionObject{"mutatingadmissionpolicybinding", b})
	}
	for _, p := range rules.Mutations {
		m := &admissionregistrationv1.MutatingAdmissionPolicy{}
		m.SetName(p.Name)
		out = append(out, admissionObject{"mutatingadmissionpolicy", m})
	}
	for _, name := range []string{native.RefusalsCreateBinding, native.Refusals} {
		b := &admissionregistrationv1.ValidatingAdmissionPolicyBinding{}
		b.SetName(name)
		out = append(out, admissionObject{"validatingadmissionpolicybinding", b})
	}
	for _, p := range rules.Policies {
		vap := &admissionregistrationv1.ValidatingAdmissionPolicy{}
		vap.SetName(p.Name)
		out = append(out, admissionObject{"validatingadmissionpolicy", vap})
	}
	cm := &corev1.ConfigMap{}
	cm.SetName(nativeconfig.ParamsName)
	cm.SetNamespace(o.namespace)
	return append(out, admissionObject{"configmap", cm}), nil
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
	hooks, err := admissionObjects(o)
	if err != nil {
		return err
	}
	for _, h := range hooks {
		kind := h.kind + "/" + h.obj.GetName()
		var err error
		if o.dryRun {
			err = c.Get(ctx, client.ObjectKeyFromObject(h.obj), h.obj)
		} else {
			err = c.Delete(ctx, h.obj)
		}
		switch {
		case apierrors.IsNotFound(err):
			fmt.Fprintf(out, "%s not found (already removed)\n", kind)
		case meta.IsNoMatchError(err):
			fmt.Fprintf(out, "%s: the cluster does not serve its kind (nothing to remove)\n", kind)
		case err != nil:
			// The finalizers must not go while the webhooks and policies
			// still guard them.
			return fmt.Errorf("removing %s (nothing else was changed): %w", kind, err)
		default:
			fmt.Fprintf(out, "%s %s\n", deleted, kind)
		}
	}

	var (
		seen, changed, verdicts, ledgers int
		errs                             []error
	)
	list := &appsv1.DeploymentList{}
	opts := []client.ListOption{client.Limit(500)}
	for {
		if err := c.List(ctx, list, opts...); err != nil {
			return errors.Join(append(errs, fmt.Errorf("listing Deployments: %w", err))...)
		}
		for i := range list.Items {
			d := &list.Items[i]
			// With the guard gone nothing would end a verdict, and the
			// Deployment controller copies its condition into every status
			// it writes: every later deploy would read as failed.
			key := client.ObjectKeyFromObject(d)
			if rollout.HasVerdict(d) && d.DeletionTimestamp == nil {
				done, err := endMark(o.dryRun, out, d, "end the rollback verdict on", "ended the rollback verdict on",
					func() (bool, error) { return endVerdict(ctx, c, key) })
				errs, verdicts = append(errs, err), verdicts+done
			} else if _, ok := rollout.ReadLedger(d); ok && d.DeletionTimestamp == nil {
				// What the guard kept about the rollouts: nothing of the
				// guard is left behind.
				done, err := endMark(o.dryRun, out, d, "remove the guard's ledger from", "removed the guard's ledger from",
					func() (bool, error) { return removeLedger(ctx, c, key) })
				errs, ledgers = append(errs, err), ledgers+done
			}
			if !slices.ContainsFunc(d.Finalizers, vocab.IsGuardFinalizer) {
				continue
			}
			seen++
			if o.dryRun {
				fmt.Fprintf(out, "would remove finalizers %v from deployment %s/%s%s\n", guardFinalizersOf(d), d.Namespace, d.Name, deletingNote(d))
				continue
			}
			removed, err := removeGuardFinalizers(ctx, c, key)
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
	switch {
	case ledgers > 0 && o.dryRun:
		fmt.Fprintf(out, "%d Deployments carry the guard's ledger (status condition %s); nothing was changed (dry run).\n", ledgers, vocab.ConditionLedger)
	case ledgers > 0:
		fmt.Fprintf(out, "Removed the guard's ledger (status condition %s) from %d Deployments.\n", vocab.ConditionLedger, ledgers)
	}
	switch {
	case verdicts > 0 && o.dryRun:
		fmt.Fprintf(out, "%d Deployments stand rolled back by the guard; nothing was changed (dry run).\n", verdicts)
	case verdicts > 0:
		fmt.Fprintf(out, "Ended the rollback verdict on %d Deployments: they no longer read as failed.\n", verdicts)
	}
	// Last, once the ledgers are gone: with it goes any platform team's
	// leave to adopt an earlier release's annotations, so that a guard
	// installed again adopts nothing a tenant wrote meanwhile (or since the
	// takeover) as its state on the Deployments whose ledgers were removed.
	errs = append(errs, closeAdoption(ctx, c, o, out, deleted))
	fmt.Fprintf(out, "Records of deleted Deployments are kept in namespace %s, and go when it is deleted; to save them: kubectl get configmaps -n %s -l %s=true -o yaml\n",
		o.namespace, o.namespace, vocab.LabelRecord)
	return errors.Join(errs...)
}

// closeAdoption deletes the ConfigMap that says when the guard's ledger began
// and whether it adopts an earlier release's annotations
// (reconciler.LedgerSince): a guard installed again starts a ledger of its
// own, adopting nothing.
func closeAdoption(ctx context.Context, c client.Client, o uninstallOptions, out io.Writer, deleted string) error {
	cm := &corev1.ConfigMap{}
	cm.SetName(reconciler.LedgerSinceConfigMap)
	cm.SetNamespace(o.namespace)
	kind := "configmap/" + cm.Name
	var err error
	if o.dryRun {
		err = c.Get(ctx, client.ObjectKeyFromObject(cm), cm)
	} else {
		err = c.Delete(ctx, cm)
	}
	switch {
	case apierrors.IsNotFound(err):
		return nil
	case err != nil:
		return fmt.Errorf("removing %s in %s: %w", kind, o.namespace, err)
	}
	fmt.Fprintf(out, "%s %s in %s (when the ledger began: a guard installed again adopts no annotations)\n", deleted, kind, o.namespace)
	return nil
}

// removeLedger removes the guard's ledger condition from one Deployment's
// status. It reports whether there was one to remove.
func removeLedger(ctx context.Context, c client.Client, key client.ObjectKey) (bool, error) {
	return changeDeployment(ctx, c, key, func(d *appsv1.Deployment) (bool, error) {
		patch := lockedPatch(d)
		if !rollout.RemoveLedger(&d.Status) {
			return false, nil
		}
		return true, c.Status().Patch(ctx, d, patch)
	})
}

// removeGuardFinalizers removes the guard's finalizers, and only those, from
// one Deployment. It returns the finalizers removed (none if the Deployment
// is gone or has none left).
func removeGuardFinalizers(ctx context.Context, c client.Client, key client.ObjectKey) ([]string, error) {
	return changeDeployment(ctx, c, key, func(d *appsv1.Deployment) ([]string, error) {
		mine := guardFinalizersOf(d)
		if len(mine) == 0 {
			return nil, nil
		}
		patch := lockedPatch(d)
		d.Finalizers = reconciler.WithoutGuardFinalizers(d.Finalizers)
		return mine, c.Patch(ctx, d, patch)
	})
}

// endVerdict removes the rollback's label first, then the Stalled condition
// and the guard's ledger (which needs patch on deployments/status). It
// reports whether the Deployment was there to end it on.
func endVerdict(ctx context.Context, c client.Client, key client.ObjectKey) (bool, error) {
	return changeDeployment(ctx, c, key, func(d *appsv1.Deployment) (bool, error) {
		if _, labelled := d.Labels[vocab.LabelRolledBack]; labelled {
			patch := lockedPatch(d)
			delete(d.Labels, vocab.LabelRolledBack)
			if err := c.Patch(ctx, d, patch); err != nil {
				return false, err
			}
		}
		patch := lockedPatch(d)
		// The verdict and the guard's ledger go together: nothing is left
		// that the guard wrote.
		if stalled, ledger := rollout.RemoveStalled(&d.Status), rollout.RemoveLedger(&d.Status); stalled || ledger {
			if err := c.Status().Patch(ctx, d, patch); err != nil {
				return false, err
			}
		}
		return true, nil
	})
}

// changeDeployment reads the Deployment key names and hands it to change,
// whose patches are conditional on the resourceVersion read (lockedPatch):
// on a conflict someone wrote it meanwhile, and it is read and changed
// again. A Deployment that is gone, when read or patched, has nothing to
// change: the zero T and no error. Otherwise it returns what change
// returns, the zero T with an error.
func changeDeployment[T any](ctx context.Context, c client.Client, key client.ObjectKey, change func(*appsv1.Deployment) (T, error)) (T, error) {
	var result T
	err := retry.RetryOnConflict(retry.DefaultBackoff, func() error {
		d := &appsv1.Deployment{}
		err := c.Get(ctx, key, d)
		if err == nil {
			result, err = change(d)
		}
		if err != nil {
			var none T
			result = none
		}
		return client.IgnoreNotFound(err)
	})
	return result, err
}

// lockedPatch is a merge patch from d as read that the API server applies
// only if d's resourceVersion is still the one read.
func lockedPatch(d *appsv1.Deployment) client.Patch {
	return client.MergeFromWithOptions(d.DeepCopy(), client.MergeFromWithOptimisticLock{})
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
