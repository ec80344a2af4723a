package image

import (
	"fmt"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// AppRepository is the test app's image name.
const AppRepository = "testapp"

// AppPort is the port the test app serves on (its PORT default).
const AppPort = 8080

// appPath is the test app's binary in its images.
const appPath = "/testapp"

// AppTag is one tag of the test app's image: the same binary, told how to
// behave by its config's environment (test/image/app reads it).
type AppTag struct {
	Tag string
	// Env is added to the image config's environment.
	Env []string
	// What the tag is for, in the real-node tier's words.
	Purpose string
}

// AppTags are the test app's tags. v1 and v2 both serve and become Ready (a
// rollout from one to the other completes); the others fail the way a bad
// release does on a real node.
func AppTags() []AppTag {
	return []AppTag{
		{Tag: "v1", Env: []string{"APP_BEHAVIOUR=serve", "APP_VERSION=v1"}, Purpose: "serves HTTP and becomes Ready"},
		{Tag: "v2", Env: []string{"APP_BEHAVIOUR=serve", "APP_VERSION=v2"}, Purpose: "serves HTTP and becomes Ready: a new revision of v1"},
		{Tag: "crash", Env: []string{"APP_BEHAVIOUR=crash", "APP_VERSION=crash"}, Purpose: "exits 1 on start: CrashLoopBackOff"},
		{Tag: "badconfig", Env: []string{"APP_BEHAVIOUR=serve", "APP_VERSION=badconfig", "APP_CONFIG=bad"}, Purpose: "reads APP_CONFIG at start, refuses \"bad\" and exits 1: CrashLoopBackOff"},
		{Tag: "never-ready", Env: []string{"APP_BEHAVIOUR=never-ready", "APP_VERSION=never-ready"}, Purpose: "serves, but /readyz always answers 503: the progress deadline"},
		{Tag: "errors", Env: []string{"APP_BEHAVIOUR=serve", "APP_VERSION=errors", "APP_ERRORS=0.3"}, Purpose: "serves 30% of the requests to / with 500 while Ready: a metric check's error rate"},
		{Tag: "latency", Env: []string{"APP_BEHAVIOUR=serve", "APP_VERSION=latency", "APP_LATENCY=300ms"}, Purpose: "answers / after 300ms while Ready: a metric check's latency"},
		{Tag: "degrades", Env: []string{"APP_BEHAVIOUR=serve", "APP_VERSION=degrades", "APP_ERRORS=0.3", "APP_DEGRADE_AFTER=60s"}, Purpose: "serves well for 60s, then 30% of the requests to / with 500: a release that degrades inside its bake window"},
		{Tag: "pause", Env: []string{"APP_BEHAVIOUR=pause", "APP_VERSION=pause"}, Purpose: "holds the pod's namespaces until SIGTERM: the real node's sandbox (pause) image"},
	}
}

// appConfig is the test app's config for a tag: the guard's user and working
// directory (it runs under a restricted pod security context too), its port,
// and the tag's environment.
func appConfig(t AppTag) v1.Config {
	c := baseConfig()
	c.User = fmt.Sprintf("%d:%d", NonRootID, NonRootID)
	c.ExposedPorts = map[string]struct{}{fmt.Sprintf("%d/tcp", AppPort): {}}
	c.Entrypoint = []string{appPath}
	c.Env = append(c.Env, t.Env...)
	return c
}

// App builds one image of the test app per tag, all with the same two
// layers (the guard's base, then the binary at /testapp): only their configs,
// and so their digests, differ.
func App(bin Binary, zoneinfo []byte) (map[string]v1.Image, error) {
	layers, err := baseAndBinary(zoneinfo, appPath, bin)
	if err != nil {
		return nil, err
	}
	imgs := map[string]v1.Image{}
	for _, t := range AppTags() {
		img, err := build(bin.Arch, appConfig(t), layers, []string{
			"distroless static nonroot's files the guard needs (test/image/base.go)",
			"the test app (test/image/app) at " + appPath,
		})
		if err != nil {
			return nil, fmt.Errorf("%s:%s: %w", AppRepository, t.Tag, err)
		}
		imgs[t.Tag] = img
	}
	return imgs, nil
}
