package image

import (
	"fmt"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// GuardRepository is the guard image's name in config/manager and the chart's
// image.repository default.
const GuardRepository = "deployguard"

// GuardTags are the tags of the guard's image: its version, and latest, which
// config/manager/deployment.yaml and the chart's default image.tag name.
func GuardTags(version string) []string {
	return []string{version, "latest"}
}

// guardPath is where the Dockerfile copies the binary (COPY … /deployguard).
const guardPath = "/deployguard"

// guardConfig is the Dockerfile's final stage over the base's config:
// USER 65532:65532, EXPOSE 9443 8080 8081 (serve's webhook, metrics and
// probe ports: --webhook-port, --metrics-bind-address,
// --health-probe-bind-address), ENTRYPOINT ["/deployguard"], CMD ["serve"].
func guardConfig() v1.Config {
	c := baseConfig()
	c.User = fmt.Sprintf("%d:%d", NonRootID, NonRootID)
	c.ExposedPorts = map[string]struct{}{"9443/tcp": {}, "8080/tcp": {}, "8081/tcp": {}}
	c.Entrypoint = []string{guardPath}
	c.Cmd = []string{"serve"}
	return c
}

// baseAndBinary are an image's two layers: the base, then bin at path,
// root's and 0755 as COPY leaves it.
func baseAndBinary(zoneinfo []byte, path string, bin Binary) ([]v1.Layer, error) {
	base, err := baseFiles(zoneinfo)
	if err != nil {
		return nil, err
	}
	bl, err := layer(base)
	if err != nil {
		return nil, err
	}
	binl, err := layer([]file{{name: path[1:], mode: 0o755, data: bin.Data}})
	if err != nil {
		return nil, err
	}
	return []v1.Layer{bl, binl}, nil
}

// Guard builds the guard's image from its binary (see GuardBuild) and the Go
// toolchain's zoneinfo.zip: the base layer, then the binary at /deployguard,
// root's and 0755 as COPY leaves it.
func Guard(bin Binary, zoneinfo []byte) (v1.Image, error) {
	layers, err := baseAndBinary(zoneinfo, guardPath, bin)
	if err != nil {
		return nil, err
	}
	return build(bin.Arch, guardConfig(), layers, []string{
		"distroless static nonroot's files the guard needs (test/image/base.go)",
		"COPY --from=build /out/deployguard " + guardPath,
	})
}
