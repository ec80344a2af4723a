// Package node is the real-node tier: the guard installed as platform teams
// install it (its own image, pulled from a registry, by `helm install` of the
// chart, with cert-manager's certificate) on a cluster whose node is real
// (kubelet, containerd, runc, CNI, kube-proxy), and Deployments whose pods
// really fail. Everything runs in a network namespace of the tier's own.
package node

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deployguard/deployguard/test/harness"
	"github.com/deployguard/deployguard/test/image"
)

// certManagerEnv passes cert-manager's controllers' binary to the run in
// the tier's network namespace.
const certManagerEnv = "DEPLOYGUARD_CERT_MANAGER"

// fluxSourceEnv and fluxKustomizeEnv pass Flux's controllers' binaries the
// same way.
const (
	fluxSourceEnv    = "DEPLOYGUARD_FLUX_SOURCE"
	fluxKustomizeEnv = "DEPLOYGUARD_FLUX_KUSTOMIZE"
)

var (
	node    *harness.Node
	cl      client.Client
	tierDir string
	// guardImage is the guard's image as the chart installs it.
	guardImage string
	// flux is source-controller and kustomize-controller, watching every
	// namespace; fluxSource the OCI registry they deploy from.
	flux       *harness.Flux
	fluxSource *harness.OCIRegistry
)

func TestMain(m *testing.M) {
	// What needs the Go module proxy is built first (cert-manager's
	// controllers): the tier itself runs without a network.
	if os.Getenv(certManagerEnv) == "" {
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
		bin, err := harness.BuildCertManager(ctx, os.Stderr)
		var src, kust string
		if err == nil {
			src, kust, err = harness.BuildFlux(ctx, os.Stderr)
		}
		if err == nil {
			// The CRDs' modules, into the module cache.
			_, err = harness.FluxCRDs(ctx)
		}
		cancel()
		if err != nil {
			fmt.Fprintln(os.Stderr, "node tier:", err)
			os.Exit(1)
		}
		os.Setenv(certManagerEnv, bin)
		os.Setenv(fluxSourceEnv, src)
		os.Setenv(fluxKustomizeEnv, kust)
	}
	if code, again := harness.EnterOwnNetwork(); !again {
		os.Exit(code)
	}
	os.Exit(harness.RunTier(m, harness.TierOptions{Name: "node", Setup: setup}))
}

func setup(ctx context.Context, tier *harness.Tier) error {
	tierDir = tier.WorkDir
	// kubectl finds the guard's plugin (bin/kubectl-deployguard) here.
	os.Setenv("PATH", filepath.Dir(tier.Guard)+":"+os.Getenv("PATH"))
	nodeTools, err := harness.NodeToolsDir(tier.Tools)
	if err != nil {
		return err
	}
	start, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	node, err = harness.StartNode(start, tier.Tools, nodeTools, fmt.Sprintf("dg-node-%d", os.Getpid()), tier.WorkDir, tier.Log)
	if err != nil {
		return err
	}
	tier.Cleanup(node.Stop)
	cfg, err := node.RESTConfig()
	if err != nil {
		return err
	}
	// The load of the upgrade test is not to be limited by client-go's
	// default 5 requests/s.
	cfg.QPS, cfg.Burst = 200, 400
	if cl, err = client.New(cfg, client.Options{}); err != nil {
		return err
	}
	images := filepath.Join(harness.RepoRoot(), "bin", "image")
	for _, repo := range []string{image.AppRepository, image.GuardRepository} {
		pushed, err := node.Push(start, filepath.Join(images, repo), repo)
		if err != nil {
			return err
		}
		fmt.Fprintf(tier.Log, "pushed %v\n", pushed)
	}
	guardImage = harness.Registry + "/" + image.GuardRepository + ":latest"

	if err := node.InstallCertManagerCRDs(start); err != nil {
		return err
	}
	cm, err := harness.StartCertManager(os.Getenv(certManagerEnv), node.Kubeconfig, tier.Log)
	if err != nil {
		return err
	}
	tier.Cleanup(func() { _ = cm.Stop() })
	if err := helmInstall(start, tier); err != nil {
		return err
	}

	if err := node.InstallFluxCRDs(start); err != nil {
		return err
	}
	fluxSource = harness.StartOCIRegistry()
	tier.Cleanup(fluxSource.Close)
	flux, err = harness.StartFlux(start, harness.FluxOptions{
		SourceController: os.Getenv(fluxSourceEnv), KustomizeController: os.Getenv(fluxKustomizeEnv),
		Kubeconfig: node.Kubeconfig, WorkDir: filepath.Join(tier.WorkDir, "flux"), Output: tier.Log})
	if err != nil {
		return err
	}
	tier.Cleanup(func() { _ = flux.Stop() })
	return nil
}
