// Command argocd-health evaluates a live object's health the way Argo CD's
// application controller does, with Argo CD's own code: gitops-engine's
// health.GetResourceHealth, given Argo CD's Lua health customizations
// (util/lua.ResourceHealthOverrides) as its override. That is the call of
// controller/cache/cache.go (the resource tree) and controller/health.go
// (setApplicationHealth, the application's health).
//
// It prints, as JSON, the verdict of the built-in checks alone ("builtin", no
// customization) and with the customization ("customized"): a Lua script
// installed as the apps/Deployment health check (-lua), or the health
// customizations of an argocd-cm ConfigMap, read by Argo CD's settings manager
// as `argocd admin settings resource-overrides health --argocd-cm-path` reads it
// (-argocd-cm).
//
// A verdict is null when Argo CD has no health for the object (no built-in
// check for its kind, no customization); "error" is the error Argo CD logs when
// a check fails, whose verdict is then Unknown.
//
// usage: argocd-health [-lua FILE | -argocd-cm FILE] [-f OBJECT.json|OBJECT.yaml|-]
//
// It is a module of its own because Argo CD's dependencies are heavy and only
// this check needs them.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime/debug"

	"github.com/argoproj/argo-cd/v3/pkg/apis/application/v1alpha1"
	"github.com/argoproj/argo-cd/v3/util/lua"
	"github.com/argoproj/argo-cd/v3/util/settings"
	"github.com/argoproj/gitops-engine/pkg/health"
	log "github.com/sirupsen/logrus"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/kubernetes/fake"
	"sigs.k8s.io/yaml"
)

// Verdict is one health assessment.
type Verdict struct {
	Status  health.HealthStatusCode `json:"status"`
	Message string                  `json:"message"`
	// Error is the error health.GetResourceHealth returned, if any.
	Error string `json:"error,omitempty"`
}

// Result is what the command prints.
type Result struct {
	// ArgoCD is the version of github.com/argoproj/argo-cd/v3 built in.
	ArgoCD     string   `json:"argocd"`
	Builtin    *Verdict `json:"builtin"`
	Customized *Verdict `json:"customized"`
}

func main() {
	luaFile := flag.String("lua", "", "Lua health script to install as the apps/Deployment health customization (argocd-cm resource.customizations.health.apps_Deployment)")
	cmFile := flag.String("argocd-cm", "", "argocd-cm ConfigMap (YAML or JSON) whose health customizations to use, read by Argo CD's settings manager")
	objFile := flag.String("f", "-", "the live object, JSON or YAML; - reads standard input")
	flag.Parse()
	if flag.NArg() > 0 || (*luaFile != "" && *cmFile != "") {
		fmt.Fprintln(os.Stderr, "usage: argocd-health [-lua FILE | -argocd-cm FILE] [-f OBJECT.json|-]")
		os.Exit(2)
	}
	// Argo CD logs through logrus (the settings manager, mostly); keep stdout JSON.
	log.SetOutput(os.Stderr)
	log.SetLevel(log.WarnLevel)

	if err := run(*luaFile, *cmFile, *objFile, os.Stdin, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "argocd-health:", err)
		os.Exit(1)
	}
}

func run(luaFile, cmFile, objFile string, stdin io.Reader, stdout io.Writer) error {
	var data []byte
	var err error
	if objFile == "-" {
		data, err = io.ReadAll(stdin)
	} else {
		data, err = os.ReadFile(objFile)
	}
	if err != nil {
		return err
	}
	obj, err := DecodeObject(data)
	if err != nil {
		return err
	}

	var overrides map[string]v1alpha1.ResourceOverride
	switch {
	case luaFile != "":
		script, err := os.ReadFile(luaFile)
		if err != nil {
			return err
		}
		overrides = DeploymentHealthOverride(string(script))
	case cmFile != "":
		cm, err := os.ReadFile(cmFile)
		if err != nil {
			return err
		}
		if overrides, err = OverridesFromConfigMap(context.Background(), cm); err != nil {
			return err
		}
	}

	res := Result{
		ArgoCD:     ModuleVersion("github.com/argoproj/argo-cd/v3"),
		Builtin:    Evaluate(obj, nil),
		Customized: Evaluate(obj, overrides),
	}
	enc := json.NewEncoder(stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(res)
}

// DecodeObject reads a JSON or YAML object as the cluster cache holds it: the
// unstructured JSON decoding of client-go's dynamic client (whole numbers
// become int64).
func DecodeObject(data []byte) (*unstructured.Unstructured, error) {
	js, err := yaml.YAMLToJSON(data)
	if err != nil {
		return nil, fmt.Errorf("decoding the object: %w", err)
	}
	obj := &unstructured.Unstructured{}
	if err := obj.UnmarshalJSON(js); err != nil {
		return nil, fmt.Errorf("decoding the object: %w", err)
	}
	return obj, nil
}

// DeploymentHealthOverride is the resource overrides Argo CD's settings manager
// makes of argocd-cm's key resource.customizations.health.apps_Deployment
// (settings.appendResourceOverridesFromSplitKeys: group_kind becomes group/kind).
func DeploymentHealthOverride(script string) map[string]v1alpha1.ResourceOverride {
	return map[string]v1alpha1.ResourceOverride{"apps/Deployment": {HealthLua: script}}
}

// OverridesFromConfigMap reads an argocd-cm ConfigMap's resource overrides
// with Argo CD's settings manager over a fake clientset, as
// `argocd admin settings resource-overrides health --argocd-cm-path` does
// (cmd/argocd/commands/admin/settings.go, createSettingsManager).
func OverridesFromConfigMap(ctx context.Context, data []byte) (map[string]v1alpha1.ResourceOverride, error) {
	var cm corev1.ConfigMap
	if err := yaml.Unmarshal(data, &cm); err != nil {
		return nil, fmt.Errorf("decoding the ConfigMap: %w", err)
	}
	if cm.Name != "argocd-cm" {
		return nil, fmt.Errorf("the ConfigMap is %q, not argocd-cm", cm.Name)
	}
	secret := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "argocd-secret"},
		Data:       map[string][]byte{"admin.password": []byte("test"), "server.secretkey": []byte("test")},
	}
	for _, o := range []metav1.Object{&cm, secret} {
		o.SetNamespace("default")
		labels := o.GetLabels()
		if labels == nil {
			labels = map[string]string{}
		}
		labels["app.kubernetes.io/part-of"] = "argocd"
		o.SetLabels(labels)
	}
	mgr := settings.NewSettingsManager(ctx, fake.NewClientset(secret, &cm), "default")
	if err := mgr.ResyncInformers(); err != nil {
		return nil, err
	}
	return mgr.GetResourceOverrides()
}

// Evaluate is Argo CD's health of obj with the given resource overrides (nil:
// a default install's checks), as controller/health.go and controller/cache/cache.go
// compute it. It is nil when Argo CD has no health for the object.
func Evaluate(obj *unstructured.Unstructured, overrides map[string]v1alpha1.ResourceOverride) *Verdict {
	// The controller always passes lua.ResourceHealthOverrides, empty without
	// customizations: Argo CD's embedded scripts (resource_customizations)
	// then still apply, as in a default install.
	hs, err := health.GetResourceHealth(obj, lua.ResourceHealthOverrides(overrides))
	if hs == nil && err == nil {
		return nil
	}
	v := &Verdict{}
	if hs != nil {
		v.Status, v.Message = hs.Status, hs.Message
	}
	if err != nil {
		v.Error = err.Error()
		if hs == nil {
			v.Status, v.Message = health.HealthStatusUnknown, err.Error()
		}
	}
	return v
}

// ModuleVersion is the version of module path built into this binary.
func ModuleVersion(path string) string {
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, m := range bi.Deps {
			if m.Path == path {
				if m.Replace != nil {
					return m.Replace.Version
				}
				return m.Version
			}
		}
	}
	return "unknown"
}
