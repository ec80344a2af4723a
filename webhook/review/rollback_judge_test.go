package review_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/deployguard/deployguard/policy"
	"github.com/deployguard/deployguard/webhook/review"
	"github.com/deployguard/deployguard/webhook/review/reviewtest"
)

// The judge asks the policies about the Deployment a rollback would leave,
// as an update by a user no exemption names; and it does not answer before
// the policies in force are loaded, when an answer from the built-in
// library alone could let a refused template back.
func TestRollbackJudge(t *testing.T) {
	var asked []policy.Request
	loaded := false
	j := review.RollbackJudge{
		Reviewer: &review.Reviewer{Options: reviewtest.Options(), Overlaps: reviewtest.Index(), Policies: reviewtest.PoliciesFunc(func(in policy.Request) policy.Decision {
			asked = append(asked, in)
			return policy.Decision{Denied: []policy.Finding{{Policy: "nohostnetwork", Message: "host networking is not allowed", Field: "spec.template.spec.hostNetwork", Mode: policy.ModeEnforce, Rule: "deny"}}}
		})},
		Loaded: func() bool { return loaded },
	}
	current := reviewtest.Guarded()
	restored := current.DeepCopy()
	restored.Spec.Template.Spec.HostNetwork = true

	refusals, err := j.JudgeRollback(context.Background(), restored, current)
	require.ErrorIs(t, err, review.ErrPoliciesNotLoaded)
	assert.Empty(t, refusals)
	assert.Empty(t, asked, "no policy is asked before the set is loaded")

	loaded = true
	refusals, err = j.JudgeRollback(context.Background(), restored, current)
	require.NoError(t, err)
	require.Len(t, asked, 1)
	assert.Equal(t, "UPDATE", asked[0].Operation)
	assert.Equal(t, review.RollbackUsername, asked[0].UserInfo.Username)
	require.Len(t, refusals, 1)
	assert.Contains(t, refusals[0], "host networking is not allowed")
}
