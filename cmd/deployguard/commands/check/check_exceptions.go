package check

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/deployguard/deployguard/cmd/deployguard/config"
	"github.com/deployguard/deployguard/webhook/exception"
)

// readExceptions reads the PolicyExceptions of a file or directory (the
// documents of other kinds are passed over) into an index, as the guard's
// informer would: CI then applies the exceptions the cluster applies, with
// the same clock. A malformed exception is an error, as the guard's webhook
// would refuse it; an expired one is kept, and applies to nothing.
func readExceptions(path string, cfg config.Config, policies []string) (*exception.Index, error) {
	docs, err := readDocuments(path, nil)
	if err != nil {
		return nil, err
	}
	limits := cfg.ExceptionLimits(defaultGuardNamespace, policies)
	limits.AllowExpired = true
	idx := exception.NewIndex(limits.Namespace)
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
		return nil, fmt.Errorf("the guard would refuse these exceptions:\n  %s", strings.Join(problems, "\n  "))
	}
	return idx, nil
}

// defaultGuardNamespace is the guard's namespace of a default install, where
// exceptions live unless exceptions.namespace says otherwise.
const defaultGuardNamespace = "deployguard-system"
