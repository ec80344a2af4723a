package reconciler

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

// The messages are those the kubelet writes in a container's waiting state:
// pkg/kubelet/images/image_manager.go ("Back-off pulling image %q" plus the
// previous pull error, "<reason>: <message>"; evalCRIPullErr's "image pull
// failed for %s because the registry is unavailable%s"), around containerd's
// pull errors (internal/cri/server/images/image_pull.go "failed to pull and
// unpack image %q: %w"; core/remotes/docker/resolver.go "%s: not found" and
// "pull access denied, repository does not exist or may require
// authorization: %w"; core/remotes/errors "unexpected status from %s request
// to %s: %s"; errcode.go "<code>: <message>"), Go's net and net/http errors,
// and kubelet_pods.go's CreateContainerConfigError messages.
func TestClassifyFailure(t *testing.T) {
	const ref = "registry.example.com/shop/web:1.4"
	backoff := `Back-off pulling image "` + ref + `": ErrImagePull: `
	unpack := `failed to pull and unpack image "` + ref + `": `
	resolve := `failed to resolve reference "` + ref + `": `
	for _, tc := range []struct {
		reason, message string
		class, cause    string
	}{
		// Permanent: the registry answered.
		{"ErrImagePull", unpack + resolve + ref + ": not found", ClassPermanent, "not found"},
		{"ImagePullBackOff", backoff + unpack + resolve + ref + ": not found", ClassPermanent, "not found"},
		{"ErrImagePull", unpack + `failed to resolve reference "` + ref + `": unexpected status from GET request to https://registry.example.com/v2/shop/web/manifests/1.4: 404 Not Found
unknown: manifest unknown`, ClassPermanent, "manifest unknown"},
		{"ErrImagePull", unpack + resolve + "pull access denied, repository does not exist or may require authorization: server message: insufficient_scope: authorization failed", ClassPermanent, "denied"},
		{"ErrImagePull", unpack + resolve + "unexpected status from HEAD request to https://registry.example.com/v2/shop/web/manifests/1.4: 401 Unauthorized", ClassPermanent, "unauthorized"},
		{"ImagePullBackOff", backoff + unpack + resolve + "pull access denied, repository does not exist or may require authorization: authorization failed: no basic auth credentials", ClassPermanent, "denied"},
		{"ErrImagePull", unpack + "unexpected status from HEAD request to https://registry.example.com/v2/shop/web/manifests/1.4: 403 Forbidden\ndenied: requested access to the resource is denied", ClassPermanent, "denied"},
		{"InvalidImageName", `Failed to apply default image tag "Shop/Web:1.4": couldn't parse image name "Shop/Web:1.4": invalid reference format: repository name must be lowercase`, ClassPermanent, "InvalidImageName"},
		{"SignatureValidationFailed", "image pull failed for " + ref + " because the signature validation failed: no signature", ClassPermanent, "SignatureValidationFailed"},

		// Transient: the registry could not be reached, or asked to wait.
		{"ErrImagePull", unpack + resolve + `failed to do request: Head "https://registry.example.com/v2/shop/web/manifests/1.4": dial tcp 203.0.113.10:443: i/o timeout`, ClassTransient, "i/o timeout"},
		{"ImagePullBackOff", backoff + unpack + resolve + `failed to do request: Head "https://registry.example.com/v2/shop/web/manifests/1.4": dial tcp 203.0.113.10:443: connect: connection refused`, ClassTransient, "connection refused"},
		{"ErrImagePull", unpack + resolve + `failed to do request: Head "https://registry.example.com/v2/shop/web/manifests/1.4": net/http: TLS handshake timeout`, ClassTransient, "tls handshake timeout"},
		{"ErrImagePull", unpack + resolve + "unexpected status from HEAD request to https://registry.example.com/v2/shop/web/manifests/1.4: 429 Too Many Requests", ClassTransient, "too many requests"},
		{"ErrImagePull", unpack + resolve + "unexpected status from HEAD request to https://registry.example.com/v2/shop/web/manifests/1.4: 503 Service Unavailable", ClassTransient, "service unavailable"},
		{"ErrImagePull", "rpc error: code = DeadlineExceeded desc = context deadline exceeded", ClassTransient, "context deadline exceeded"},
		// As the real node's kubelet wrote it (test/node), for a registry that
		// accepted the connection and answered nothing.
		{"ImagePullBackOff", `Back-off pulling image "127.0.0.1:5000/testapp:slow": ErrImagePull: rpc error: code = DeadlineExceeded desc = failed to pull and unpack image "127.0.0.1:5000/testapp:slow": failed to resolve image: failed to do request: Head "http://127.0.0.1:5000/v2/testapp/manifests/slow": net/http: timeout awaiting response headers`, ClassTransient, "timeout awaiting response headers"},
		{"ErrImagePull", `rpc error: code = DeadlineExceeded desc = failed to pull and unpack image "` + ref + `": failed to copy: read tcp 10.0.0.1:5000: use of closed network connection`, ClassTransient, "code = deadlineexceeded"},
		// As the real node's kubelet wrote them for the registry stopped and
		// for a tag it lacks.
		{"ErrImagePull", `failed to pull and unpack image "127.0.0.1:5000/testapp:v2": failed to resolve image: failed to do request: Head "http://127.0.0.1:5000/v2/testapp/manifests/v2": dial tcp 127.0.0.1:5000: connect: connection refused`, ClassTransient, "connection refused"},
		{"ErrImagePull", `rpc error: code = NotFound desc = failed to pull and unpack image "127.0.0.1:5000/testapp:no-such-tag": failed to resolve image: 127.0.0.1:5000/testapp:no-such-tag: not found`, ClassPermanent, "not found"},
		{"ErrImagePull", unpack + `failed to copy: httpReadSeeker: failed open: unexpected status code https://registry.example.com/v2/shop/web/blobs/sha256:5030aa: 502`, ClassTransient, "HTTP 502"},
		{"RegistryUnavailable", "image pull failed for " + ref + " because the registry is unavailable: dial tcp: lookup registry.example.com: i/o timeout", ClassTransient, "registry unavailable"},
		{"ErrImagePull", unpack + resolve + `failed to do request: Head "https://registry.example.com/v2/": dial tcp: lookup registry.example.com on 10.96.0.10:53: server misbehaving`, ClassTransient, "server misbehaving"},

		// Neither: a message the guard does not recognise, a back-off that
		// lost its cause (a restarted kubelet), a crash loop.
		{"ImagePullBackOff", `Back-off pulling image "` + ref + `"`, "", ""},
		{"ErrImagePull", unpack + `failed to do request: Head "https://registry.example.com/v2/": dial tcp: lookup registry.example.com: no such host`, "", ""},
		{"CrashLoopBackOff", "back-off 5m0s restarting failed container=web pod=web-5d8f7c9b4-abcde_shop(uid)", "", ""},
		{"ErrImagePull", unpack + "layer sha256:a5030b unexpected size", "", ""},

		// CreateContainerConfigError: missing until it is created.
		{"CreateContainerConfigError", `configmap "settings" not found`, ClassPermanent, "not found"},
		{"CreateContainerConfigError", "couldn't find key DATABASE_URL in Secret shop/db", ClassPermanent, "couldn't find key"},
		{"CreateContainerConfigError", "container has runAsNonRoot and image will run as root (pod: \"web_shop(uid)\", container: web)", ClassPermanent, "runasnonroot"},
		{"CreateContainerConfigError", `failed to sync configmap cache: timed out waiting for the condition`, ClassTransient, "timed out waiting for the condition"},
	} {
		t.Run(tc.reason+" "+tc.cause, func(t *testing.T) {
			class, cause := ClassifyFailure(tc.reason, tc.message)
			assert.Equal(t, tc.class, class, tc.message)
			assert.Equal(t, tc.cause, cause, tc.message)
		})
	}
}

func TestEvidenceClass(t *testing.T) {
	p, tr, none := PodFailure{Class: ClassPermanent}, PodFailure{Class: ClassTransient}, PodFailure{}
	for _, tc := range []struct {
		name     string
		evidence []PodFailure
		want     string
	}{
		{"nothing", nil, ""},
		{"all transient", []PodFailure{tr, tr}, ClassTransient},
		{"all permanent", []PodFailure{p, p}, ClassPermanent},
		{"a permanent among transients", []PodFailure{tr, p, tr}, ClassPermanent},
		{"a crash loop among transients", []PodFailure{tr, none}, ""},
		{"unclassified", []PodFailure{none}, ""},
	} {
		assert.Equal(t, tc.want, EvidenceClass(tc.evidence), tc.name)
	}
}

// The window a decision waits depends on the evidence: transient only, the
// transient window; anything else, the ordinary one, from the first evidence.
func TestDecideFailFastWindowByClass(t *testing.T) {
	now := time.Date(2026, 11, 24, 12, 0, 0, 0, time.UTC)
	pod := func(class string) PodState {
		return PodState{Name: "p-" + class, Failure: &PodFailure{Pod: "p-" + class, Reason: "ImagePullBackOff", Class: class, Cause: "x"}}
	}
	for _, tc := range []struct {
		name   string
		pods   []PodState
		held   time.Duration
		failed bool
		window time.Duration
	}{
		{"permanent, past the window", []PodState{pod(ClassPermanent)}, 61 * time.Second, true, time.Minute},
		{"transient, past the ordinary window", []PodState{pod(ClassTransient)}, 61 * time.Second, false, 5 * time.Minute},
		{"transient, past its own window", []PodState{pod(ClassTransient)}, 5 * time.Minute, true, 5 * time.Minute},
		{"a mix, past the ordinary window", []PodState{pod(ClassTransient), pod(ClassPermanent)}, 61 * time.Second, true, time.Minute},
		{"unclassified, past the ordinary window", []PodState{pod("")}, 61 * time.Second, true, time.Minute},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := DecideFailFast(FailFastInput{Now: now, Pods: tc.pods, FailingSince: now.Add(-tc.held), Window: time.Minute, TransientWindow: 5 * time.Minute})
			assert.Equal(t, tc.failed, v.Failed)
			assert.Equal(t, tc.window, v.Window)
			if !tc.failed {
				assert.Equal(t, tc.window-tc.held, v.RequeueAfter)
			}
		})
	}
}
