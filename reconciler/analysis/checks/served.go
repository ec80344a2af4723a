package checks

import (
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/rest"
)

// Served reports whether the API server serves both kinds (their CRDs are
// installed): a guard whose cache asked for a kind the API server does not
// know would never sync.
func Served(cfg *rest.Config) bool {
	dc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return false
	}
	list, err := dc.ServerResourcesForGroupVersion(GroupVersion.String())
	if err != nil {
		return false
	}
	found := 0
	for _, r := range list.APIResources {
		if r.Name == "clusterdeploymentchecks" || r.Name == "deploymentchecks" {
			found++
		}
	}
	return found == 2
}
