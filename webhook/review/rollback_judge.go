package review

import (
	"context"
	"errors"

	admissionv1 "k8s.io/api/admission/v1"
	appsv1 "k8s.io/api/apps/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
)

// RollbackUsername is the user a rollback's restored Deployment is judged
// as: no exempt user or group of the platform's configuration matches it, so
// that the guard's own, much wider, identity never lets a template past the
// policies. Exempt namespaces still apply.
const RollbackUsername = "deployguard:rollback"

// RollbackJudge judges the Deployment a rollback of the guard would leave
// with the policies in force, as the validating webhook judges an update of
// the tenant's: the guard restores a template under its own identity, which
// no admission policy sees, so it asks them first.
type RollbackJudge struct {
	Reviewer *Reviewer
	// Loaded reports whether the platform's policy ConfigMaps are in the set
	// yet; nil means always. Until they are, the policies in force are not
	// known: a leader that starts before they load would judge with the
	// built-in library alone and could restore a template an enforced
	// policy refuses.
	Loaded func() bool
}

// ErrPoliciesNotLoaded says the rollback cannot be judged yet.
var ErrPoliciesNotLoaded = errors.New("the policy ConfigMaps are not loaded yet")

// JudgeRollback returns the policies' refusals of restored (the update of
// current that the rollback would make), one line each as the API server
// would print them; none when the policies admit it. ErrPoliciesNotLoaded
// until the policies in force are known.
func (j RollbackJudge) JudgeRollback(ctx context.Context, restored, current *appsv1.Deployment) ([]string, error) {
	if j.Loaded != nil && !j.Loaded() {
		return nil, ErrPoliciesNotLoaded
	}
	rev := j.Reviewer.Review(ctx, Request{
		Operation: admissionv1.Update, Object: restored, OldObject: current,
		UserInfo: authenticationv1.UserInfo{Username: RollbackUsername},
	}, Stage{Policies: true})
	var out []string
	for _, f := range rev.Findings {
		if f.Severity == SeverityError {
			out = append(out, f.Line())
		}
	}
	return out, nil
}
