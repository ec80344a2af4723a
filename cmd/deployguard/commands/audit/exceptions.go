package audit

import (
	"context"
	"fmt"
	"sort"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deployguard/deployguard/webhook/exception"
)

// exceptionCoverage reads the PolicyExceptions of exceptionsNS and the
// Deployments of the namespaces they cover (only ns, when set) and says what
// each covers now. served is false without the PolicyException API.
func exceptionCoverage(ctx context.Context, c client.Reader, exceptionsNS, ns string, warning time.Duration) (list []exception.Covered, served bool, err error) {
	items, served, err := exception.ListOnce(ctx, c, exceptionsNS)
	if err != nil || !served {
		return nil, served, err
	}
	var exceptions []*exception.Exception
	namespaces := map[string]bool{}
	for i := range items {
		e, err := exception.From(&items[i])
		if err != nil {
			return nil, true, fmt.Errorf("PolicyException %s/%s: %w", items[i].Namespace, items[i].Name, err)
		}
		if ns != "" && e.Namespace != ns {
			continue
		}
		exceptions = append(exceptions, e)
		namespaces[e.Namespace] = true
	}
	sort.Slice(exceptions, func(i, j int) bool { return exceptions[i].Name.String() < exceptions[j].Name.String() })
	var deployments []appsv1.Deployment
	for n := range namespaces {
		var l appsv1.DeploymentList
		if err := c.List(ctx, &l, client.InNamespace(n)); err != nil {
			return nil, true, fmt.Errorf("listing the Deployments of %s: %w", n, err)
		}
		deployments = append(deployments, l.Items...)
	}
	sort.Slice(deployments, func(i, j int) bool {
		return deployments[i].Namespace+"/"+deployments[i].Name < deployments[j].Namespace+"/"+deployments[j].Name
	})
	return exception.Coverage(exceptions, deployments, time.Now(), warning), true, nil
}
