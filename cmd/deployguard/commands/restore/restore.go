package restore

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/spf13/cobra"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deployguard/deployguard/cmd/deployguard/cli"
	"github.com/deployguard/deployguard/reconciler"
	"github.com/deployguard/deployguard/reconciler/rollout"
	"github.com/deployguard/deployguard/reconciler/vocab"
)

// defaultGuardNamespace is the guard's namespace of a default install
// (`deployguard serve --namespace`).
const defaultGuardNamespace = "deployguard-system"

// NewCommand is `deployguard restore NAMESPACE/NAME`: it recreates a
// deleted Deployment from the record the guard saved when it was deleted.
func NewCommand(s cli.Streams) *cobra.Command {
	o := options{cluster: cli.NewCluster()}
	cmd := cli.NewClusterCommand(s, o.cluster, &cobra.Command{
		Use:   "restore [flags] NAMESPACE/NAME",
		Short: "recreate a deleted Deployment from the guard's record of it",
		Long: `Recreates a deleted Deployment in NAMESPACE from the record deployguard saved
when it was deleted: ConfigMap deployguard-record-NAMESPACE.NAME in the
guard's own namespace (--guard-namespace), where tenants cannot write.
Without --legacy-record it reads no record anywhere else. It never
overwrites a Deployment that exists.

An earlier release of deployguard kept records in the Deployment's own
namespace (ConfigMap deployguard-record-NAME in NAMESPACE). Anyone who may
write ConfigMaps there (the built-in edit role) can have written or changed
such a record, and restore would recreate whatever it says. Only with
--legacy-record, and only when the guard's namespace holds no record of the
Deployment, does restore read one there, and it prints a warning. Read it
first: kubectl get configmap deployguard-record-NAME -n NAMESPACE -o yaml`,
		Example: `  kubectl deployguard restore shop/web
  kubectl deployguard restore web -n shop --known-good`,
		ValidArgsFunction: cobra.NoFileCompletions,
		RunE: func(cmd *cobra.Command, args []string) error {
			ns, name, err := cli.NamespacedName(args, o.cluster)
			if err == nil && o.guardNamespace == "" {
				err = errors.New("give a --guard-namespace")
			}
			if err != nil {
				return cli.ArgsError(cmd, err)
			}
			o.namespace, o.name = ns, name
			return o.cluster.Do(cmd, cli.Timeout, func(ctx context.Context, c client.Client) error {
				return restoreDeployment(ctx, c, o, s.Out, s.ErrOut)
			})
		},
	})
	cmd.Flags().BoolVar(&o.knownGood, "known-good", false, "restore the pod template of the last revision that completed its rollout, instead of the template the Deployment had when it was deleted")
	cmd.Flags().StringVar(&o.guardNamespace, "guard-namespace", defaultGuardNamespace, "the guard's own namespace (deployguard serve --namespace), where its records are")
	cmd.Flags().BoolVar(&o.legacyRecord, "legacy-record", false, "when the guard's namespace holds no record, read one an earlier release saved in the Deployment's own namespace, where anyone who may write ConfigMaps there can have written it (a warning says so)")
	return cmd
}

// options are what one restore needs.
type options struct {
	// cluster is where the Deployment was, as kubectl's flags name it.
	cluster *cli.Cluster
	// guardNamespace is where the guard keeps its records.
	guardNamespace string
	// namespace and name are the Deployment's.
	namespace, name string
	knownGood       bool
	// legacyRecord: without a record in guardNamespace, read an earlier
	// release's, in the Deployment's own namespace.
	legacyRecord bool
}

// restoreDeployment recreates the Deployment o names from its record; a
// warning about the record's origin goes to warn.
func restoreDeployment(ctx context.Context, c client.Client, o options, out, warn io.Writer) error {
	cm, err := findRecord(ctx, c, o, warn)
	if err != nil {
		return err
	}
	key := types.NamespacedName{Namespace: o.namespace, Name: o.name}
	d, err := reconciler.DeploymentFromRecord(cm, key, o.knownGood)
	if err != nil {
		return err
	}

	existing := &appsv1.Deployment{}
	switch err := c.Get(ctx, key, existing); {
	case err == nil:
		return refuseOverwrite(existing)
	case !apierrors.IsNotFound(err):
		return fmt.Errorf("checking that Deployment %s does not exist: %w", key, err)
	}
	if err := c.Create(ctx, d); err != nil {
		if apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("deployment %s was created meanwhile; restore never overwrites a Deployment", key)
		}
		return fmt.Errorf("creating Deployment %s: %w", key, err)
	}

	template := "the template it had when it was deleted"
	if o.knownGood {
		template = "the known-good template of revision " + cm.Data[reconciler.RecordKeyKnownGoodRevision]
	}
	fmt.Fprintf(out, "deployment.apps/%s restored in namespace %s from record %s/%s (%d replicas, %s).\n",
		o.name, o.namespace, cm.Namespace, cm.Name, rollout.Replicas(d), template)
	if v := cm.Annotations[vocab.AnnotationRecordExpires]; v != "" {
		fmt.Fprintf(out, "The record is kept until %s.\n", v)
	}
	return nil
}

// findRecord reads the record of the Deployment o names from the guard's
// namespace, and checks that it is the guard's record of that Deployment.
// With o.legacyRecord, when there is none, it reads an earlier release's
// from the Deployment's namespace, and warns that anyone who may write
// ConfigMaps there can have written it.
func findRecord(ctx context.Context, c client.Client, o options, warn io.Writer) (*corev1.ConfigMap, error) {
	key := types.NamespacedName{Namespace: o.namespace, Name: o.name}
	recordKey := types.NamespacedName{Namespace: o.guardNamespace, Name: reconciler.RecordName(o.namespace, o.name)}
	cm := &corev1.ConfigMap{}
	switch err := c.Get(ctx, recordKey, cm); {
	case err == nil:
		return cm, checkRecord(cm, o.guardNamespace, key)
	case !apierrors.IsNotFound(err):
		return nil, fmt.Errorf("reading record %s: %w", recordKey, err)
	}
	noRecord := fmt.Sprintf("no record of Deployment %s (no ConfigMap %s in namespace %s). "+
		"deployguard saves one when a guarded Deployment is deleted and keeps it for the configured retention (cleanup.recordRetention); "+
		"there is none if the Deployment was deleted with %s=true, in a namespace being deleted or opted out of the guard, while the guard was not installed, or if the record expired",
		key, recordKey.Name, recordKey.Namespace, vocab.AnnotationSkipCleanup)

	legacyKey := types.NamespacedName{Namespace: o.namespace, Name: reconciler.LegacyRecordName(o.name)}
	legacy := &corev1.ConfigMap{}
	legacyErr := c.Get(ctx, legacyKey, legacy)
	if !o.legacyRecord {
		if legacyErr == nil && legacy.Labels[vocab.LabelRecord] == "true" {
			noRecord += fmt.Sprintf(". Namespace %s holds ConfigMap %s labelled as a record, as an earlier release saved them; "+
				"anyone who may write ConfigMaps there can have written it. Read it, and restore from it with --legacy-record if it is what you want back",
				o.namespace, legacyKey.Name)
		}
		return nil, errors.New(noRecord)
	}
	switch {
	case apierrors.IsNotFound(legacyErr):
		return nil, fmt.Errorf("%s; nor is there an earlier release's record (no ConfigMap %s in namespace %s)", noRecord, legacyKey.Name, legacyKey.Namespace)
	case legacyErr != nil:
		return nil, fmt.Errorf("reading the earlier release's record %s: %w", legacyKey, legacyErr)
	}
	if of := legacy.Annotations[vocab.AnnotationRecordOf]; of != o.name {
		return nil, fmt.Errorf("ConfigMap %s is not an earlier release's record of Deployment %q (its %s is %q)", legacyKey, o.name, vocab.AnnotationRecordOf, of)
	}
	fmt.Fprintf(warn, "deployguard restore: warning: restoring from ConfigMap %s, an earlier release's record in the Deployment's own namespace: "+
		"anyone who may write ConfigMaps in namespace %s can have written or changed it, and it is restored as it reads.\n", legacyKey, o.namespace)
	return legacy, nil
}

// checkRecord refuses a ConfigMap that is not the guard's record of
// Deployment key: one outside the guard's namespace, or the record of
// another Deployment.
func checkRecord(cm *corev1.ConfigMap, guardNamespace string, key types.NamespacedName) error {
	if cm.Namespace != guardNamespace {
		return fmt.Errorf("ConfigMap %s/%s is not in the guard's namespace %s: the guard's records are there only", cm.Namespace, cm.Name, guardNamespace)
	}
	if cm.Labels[vocab.LabelRecord] != "true" {
		return fmt.Errorf("ConfigMap %s/%s has no label %s=true: %w", cm.Namespace, cm.Name, vocab.LabelRecord, reconciler.ErrNotARecord)
	}
	of, ok := reconciler.RecordOf(cm)
	if !ok || of != key {
		return fmt.Errorf("ConfigMap %s/%s is the record of Deployment %q (annotations %s and %s), not %q",
			cm.Namespace, cm.Name, of.String(), vocab.AnnotationRecordNamespace, vocab.AnnotationRecordOf, key.String())
	}
	return nil
}

func refuseOverwrite(d *appsv1.Deployment) error {
	if d.DeletionTimestamp != nil {
		return fmt.Errorf("deployment %s/%s is still being deleted (finalizers %v); restore it once it is gone", d.Namespace, d.Name, d.Finalizers)
	}
	return fmt.Errorf("deployment %s/%s exists; restore never overwrites a Deployment: delete it first if the record is what you want back", d.Namespace, d.Name)
}
