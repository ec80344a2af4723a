package check

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/deployguard/deployguard/cmd/deployguard/cli"
	"github.com/deployguard/deployguard/cmd/deployguard/config"
	"github.com/deployguard/deployguard/webhook/exception"
)

// exceptionIndex gathers the exceptions check applies, from --exceptions and
// --cluster-exceptions, into an index as the guard's informer would: CI then
// applies the exceptions the cluster applies, with the same clock.
func exceptionIndex(f checkFlags, cfg config.Config, policies []string) (*exception.Index, error) {
	limits := cfg.ExceptionLimits(defaultGuardNamespace, policies)
	limits.AllowExpired = true
	idx := exception.NewIndex(limits.Namespace)
	if f.exceptions != "" {
		if err := readExceptions(idx, f.exceptions, limits); err != nil {
			return nil, fmt.Errorf("--exceptions %s: %w", f.exceptions, err)
		}
	}
	if f.clusterExceptions {
		if err := readClusterExceptions(idx, f.kubeconfig); err != nil {
			return nil, fmt.Errorf("--cluster-exceptions: %w", err)
		}
	}
	return idx, nil
}

// readExceptions reads the PolicyExceptions of a file or directory (the
// documents of other kinds are passed over) into idx. A malformed exception
// is an error, as the guard's webhook would refuse it; an expired one is
// kept, and applies to nothing.
func readExceptions(idx *exception.Index, path string, limits exception.Limits) error {
	docs, err := readDocuments(path, nil)
	if err != nil {
		return err
	}
	var problems []string
	for _, d := range docs {
		var head struct {
			APIVersion, Kind string
		}
		if json.Unmarshal(d.json, &head) != nil || head.Kind != exception.Kind || head.APIVersion != exception.GroupVersion.String() {
			continue
		}
		pe := &exception.PolicyException{}
		if err := json.Unmarshal(d.json, pe); err != nil {
			problems = append(problems, fmt.Sprintf("%s#%d: not a PolicyException: %v", d.file, d.index, err))
			continue
		}
		if errs := exception.Validate(pe, time.Now(), limits); len(errs) > 0 {
			problems = append(problems, fmt.Sprintf("%s#%d PolicyException %s/%s: %v", d.file, d.index, pe.Namespace, pe.Name, errs.ToAggregate()))
			continue
		}
		idx.Set(pe)
	}
	if len(problems) > 0 {
		return fmt.Errorf("the guard would refuse these exceptions:\n  %s", strings.Join(problems, "\n  "))
	}
	return nil
}

// readClusterExceptions adds the exceptions the cluster holds in idx's
// namespace, read once. They are taken as stored: the guard honours what its
// webhook admitted, even under limits changed since.
func readClusterExceptions(idx *exception.Index, kubeconfig string) error {
	c, err := cli.NewClient(kubeconfig)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	items, served, err := exception.ListOnce(ctx, c, idx.Namespace)
	if err != nil {
		return err
	}
	if !served {
		return fmt.Errorf("the cluster does not serve PolicyExceptions (%s): install config/crd/exceptions", exception.GroupVersion)
	}
	for i := range items {
		idx.Set(&items[i])
	}
	return nil
}

// defaultGuardNamespace is the guard's namespace of a default install, where
// exceptions live unless exceptions.namespace says otherwise.
const defaultGuardNamespace = "deployguard-system"
