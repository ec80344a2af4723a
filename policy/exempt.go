package policy

import (
	"fmt"
	"slices"
)

// exemption says why a request skips policies, if it does. Only the guard's
// configuration and the authenticated request count, never the object.
func exemption(ex Exemptions, r Request) (string, bool) {
	if slices.Contains(ex.Namespaces, r.Namespace) {
		return fmt.Sprintf("namespace %q is exempt from policies", r.Namespace), true
	}
	if slices.Contains(ex.Usernames, r.UserInfo.Username) {
		return fmt.Sprintf("user %q is exempt from policies", r.UserInfo.Username), true
	}
	for _, g := range r.UserInfo.Groups {
		if slices.Contains(ex.Groups, g) {
			return fmt.Sprintf("group %q of user %q is exempt from policies", g, r.UserInfo.Username), true
		}
	}
	return "", false
}
