package restore

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deployguard/deployguard/cmd/deployguard/cli"
	"github.com/deployguard/deployguard/reconciler"
	"github.com/deployguard/deployguard/reconciler/vocab"
)

// Run is `deployguard restore NAMESPACE/NAME`: it recreates a deleted
// Deployment from the record the guard saved when it was deleted.
func Run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("deployguard restore", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), `Usage: deployguard restore [flags] NAMESPACE/NAME

Recreates a deleted Deployment from the record deployguard saved when it was
deleted (ConfigMap deployguard-record-NAME in NAMESPACE). It never overwrites a
Deployment that exists.

Flags:
`)
		fs.PrintDefaults()
	}
	kubeconfig := fs.String("kubeconfig", "", "path of a kubeconfig; in-cluster configuration or $KUBECONFIG when empty")
	knownGood := fs.Bool("known-good", false, "restore the pod template of the last revision that completed its rollout, instead of the template the Deployment had when it was deleted")
	positional, err := cli.ParseInterspersed(fs, args)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	ns, name, ok := cli.SplitNamespacedName(positional)
	if !ok {
		fmt.Fprintln(stderr, "deployguard restore: give exactly one NAMESPACE/NAME")
		fs.Usage()
		return 2
	}
	c, err := cli.NewClient(*kubeconfig)
	if err != nil {
		fmt.Fprintf(stderr, "deployguard restore: %v\n", err)
		return 1
	}
	ctx, cancel := context.WithTimeout(context.Background(), cli.Timeout)
	defer cancel()
	if err := restoreDeployment(ctx, c, ns, name, *knownGood, stdout); err != nil {
		fmt.Fprintf(stderr, "deployguard restore: %v\n", err)
		return 1
	}
	return 0
}

// restoreDeployment recreates Deployment namespace/name from its record.
func restoreDeployment(ctx context.Context, c client.Client, namespace, name string, knownGood bool, out io.Writer) error {
	cm := &corev1.ConfigMap{}
	recordName := reconciler.RecordName(name)
	if err := c.Get(ctx, client.ObjectKey{Namespace: namespace, Name: recordName}, cm); err != nil {
		if apierrors.IsNotFound(err) {
			return fmt.Errorf("no record of Deployment %s/%s (no ConfigMap %s in namespace %s). "+
				"deployguard saves one when a guarded Deployment is deleted and keeps it for the configured retention (cleanup.recordRetention); "+
				"there is none if the Deployment was deleted with %s=true, in a namespace being deleted or opted out of the guard, while the guard was not installed, or if the record expired",
				namespace, name, recordName, namespace, vocab.AnnotationSkipCleanup)
		}
		return fmt.Errorf("reading record %s/%s: %w", namespace, recordName, err)
	}
	if of := cm.Annotations[vocab.AnnotationRecordOf]; of != "" && of != name {
		return fmt.Errorf("ConfigMap %s/%s is the record of Deployment %q, not %q", namespace, recordName, of, name)
	}
	d, err := reconciler.DeploymentFromRecord(cm, knownGood)
	if err != nil {
		return err
	}

	existing := &appsv1.Deployment{}
	switch err := c.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, existing); {
	case err == nil:
		return refuseOverwrite(existing)
	case !apierrors.IsNotFound(err):
		return fmt.Errorf("checking that Deployment %s/%s does not exist: %w", namespace, name, err)
	}
	if err := c.Create(ctx, d); err != nil {
		if apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("deployment %s/%s was created meanwhile; restore never overwrites a Deployment", namespace, name)
		}
		return fmt.Errorf("creating Deployment %s/%s: %w", namespace, name, err)
	}

	template := "the template it had when it was deleted"
	if knownGood {
		template = "the known-good template of revision " + cm.Data[reconciler.RecordKeyKnownGoodRevision]
	}
	fmt.Fprintf(out, "deployment.apps/%s restored in namespace %s from record %s (%d replicas, %s).\n",
		name, namespace, recordName, replicasOf(d), template)
	if v := cm.Annotations[vocab.AnnotationRecordExpires]; v != "" {
		fmt.Fprintf(out, "The record is kept until %s.\n", v)
	}
	return nil
}

func refuseOverwrite(d *appsv1.Deployment) error {
	if d.DeletionTimestamp != nil {
		return fmt.Errorf("deployment %s/%s is still being deleted (finalizers %v); restore it once it is gone", d.Namespace, d.Name, d.Finalizers)
	}
	return fmt.Errorf("deployment %s/%s exists; restore never overwrites a Deployment: delete it first if the record is what you want back", d.Namespace, d.Name)
}

func replicasOf(d *appsv1.Deployment) int32 {
	if d.Spec.Replicas == nil {
		return 1
	}
	return *d.Spec.Replicas
}
