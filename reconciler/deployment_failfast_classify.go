package reconciler

import (
	"regexp"
	"strings"
)

// The classes of failure evidence. A permanent failure will not clear by
// waiting (the image does not exist, the registry refuses the credentials, a
// referenced ConfigMap key is missing); a transient one may (the registry is
// unreachable or overloaded for a while). Evidence that is neither, such as a
// crash loop or a message the guard does not recognise, is unclassified and
// treated as today: the ordinary window.
const (
	ClassPermanent = "permanent"
	ClassTransient = "transient"
)

// The markers are the words the kubelet and containerd put in a container's
// waiting message (pkg/kubelet/images/image_manager.go wraps the pull error:
// "Back-off pulling image \"x\": ErrImagePull: <containerd's error>";
// containerd's core/remotes/docker/resolver.go and errcode.go, and Go's net
// and net/http, write the error). A permanent marker wins over a transient
// one in the same message: the registry answered, and said no.
var (
	permanentPull = []string{
		": not found",             // containerd: "<ref>: not found" (HEAD 404 on the manifest)
		"manifest unknown",        // registry error code MANIFEST_UNKNOWN
		"name unknown",            // registry error code NAME_UNKNOWN
		"unauthorized",            // 401, registry error code UNAUTHORIZED
		"authentication required", // its message
		"denied",                  // "pull access denied, …", registry error code DENIED, 403 "requested access … denied"
		"403 forbidden",
		"invalidimagename",
		"signaturevalidationfailed", // CRI: the image's signature does not verify
	}
	transientPull = []string{
		"i/o timeout",
		"connection refused",
		"connection reset by peer",
		"no route to host",
		"network is unreachable",
		"tls handshake timeout",
		"context deadline exceeded",
		// Go's net/http: the registry took the request and answered nothing
		// within containerd's response-header timeout (seen on the real
		// node, test/node: "rpc error: code = DeadlineExceeded desc = …
		// net/http: timeout awaiting response headers").
		"timeout awaiting response headers",
		"code = deadlineexceeded",
		"server misbehaving", // DNS SERVFAIL
		"too many requests",  // 429, registry error code TOOMANYREQUESTS
		"toomanyrequests",
		"service unavailable",
		"bad gateway",
		"gateway timeout",
		"unexpected eof",
		"registryunavailable", // CRI: "image pull failed for x because the registry is unavailable"
		"registry is unavailable",
	}
	// transientStatus are the HTTP statuses of an overloaded or restarting
	// registry, as words: never inside a digest or a port.
	transientStatus = regexp.MustCompile(`\b(429|500|502|503|504)\b`)

	// A CreateContainerConfigError names what the pod references and cannot
	// find (kubelet_pods.go: "couldn't find key k in ConfigMap ns/name",
	// the API's "configmap \"name\" not found") or what it forbids
	// ("container has runAsNonRoot and image will run as root"): permanent
	// until someone creates the object. A cache that did not sync in time
	// is transient.
	permanentConfig = []string{"not found", "couldn't find key", "runasnonroot", "invalid"}
	transientConfig = []string{"timed out waiting for the condition", "failed to sync", "context deadline exceeded",
		"connection refused", "too many requests", "i/o timeout"}
)

// pullReasons are the waiting reasons of an image pull that failed.
var pullReasons = map[string]bool{"ErrImagePull": true, "ImagePullBackOff": true, "RegistryUnavailable": true}

// ClassifyFailure says whether a pod's evidence is permanent, transient or
// neither (""), from its waiting reason and the kubelet's message, and which
// words of the message said so (the cause); pure.
func ClassifyFailure(reason, message string) (class, cause string) {
	m := strings.ToLower(message)
	switch {
	case reason == "InvalidImageName" || reason == "SignatureValidationFailed":
		return ClassPermanent, reason
	case reason == "RegistryUnavailable":
		if w := firstOf(m, permanentPull); w != "" {
			return ClassPermanent, w
		}
		return ClassTransient, "registry unavailable"
	case pullReasons[reason]:
		if w := firstOf(m, permanentPull); w != "" {
			return ClassPermanent, strings.TrimPrefix(w, ": ")
		}
		if w := firstOf(m, transientPull); w != "" {
			return ClassTransient, w
		}
		if w := transientStatus.FindString(m); w != "" {
			return ClassTransient, "HTTP " + w
		}
	case reason == "CreateContainerConfigError":
		if w := firstOf(m, transientConfig); w != "" {
			return ClassTransient, w
		}
		if w := firstOf(m, permanentConfig); w != "" {
			return ClassPermanent, w
		}
	}
	return "", ""
}

// firstOf returns the first of words that s contains, "" if none.
func firstOf(s string, words []string) string {
	for _, w := range words {
		if strings.Contains(s, w) {
			return w
		}
	}
	return ""
}

// EvidenceClass is the class of a set of evidence: transient only when every
// piece is transient; permanent when any piece is; otherwise unclassified
// (""). A mix never waits longer than today: a registry that said "manifest
// unknown" on one node is not contradicted by a time-out on another, and a
// crash loop next to a time-out is not a registry blip.
func EvidenceClass(evidence []PodFailure) string {
	if len(evidence) == 0 {
		return ""
	}
	all := true
	for _, e := range evidence {
		if e.Class == ClassPermanent {
			return ClassPermanent
		}
		all = all && e.Class == ClassTransient
	}
	if all {
		return ClassTransient
	}
	return ""
}
