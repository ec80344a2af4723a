# METADATA
# title: Pinned images
# description: >-
#   Every container and init container names an image by a version tag or a
#   digest, never by ":latest" or by no tag at all: both mean "whatever the
#   registry holds right now", so a rollback or a rescheduled pod may run other
#   code than the one that was reviewed.
# custom:
#   mode: warn
#   severity: medium
#   category: Supply Chain
package deployguard.images

# "name:latest@sha256:…" does not end in ":latest": a digest pins it.
deny contains finding if {
	some kind in {"containers", "initContainers"}
	some i, container in input.object.spec.template.spec[kind]
	endswith(container.image, ":latest")
	repository := trim_suffix(container.image, ":latest")
	finding := {
		"msg": sprintf(
			"image %q of container %q uses the mutable tag \"latest\": set a version tag (%s:<version>) or pin a digest (%s@sha256:<digest>)",
			[container.image, container.name, repository, repository],
		),
		"field": sprintf("spec.template.spec.%s[%d].image", [kind, i]),
	}
}

# The tag follows a ":" in the last path segment; a ":" before a "/" is a
# registry port, so "registry:5000/app" has no tag.
deny contains finding if {
	some kind in {"containers", "initContainers"}
	some i, container in input.object.spec.template.spec[kind]
	not contains(container.image, "@")
	not regex.match(`:[^/]*$`, container.image)
	finding := {
		"msg": sprintf(
			"image %q of container %q has no tag, which means \"latest\": set a version tag (%s:<version>) or pin a digest (%s@sha256:<digest>)",
			[container.image, container.name, container.image, container.image],
		),
		"field": sprintf("spec.template.spec.%s[%d].image", [kind, i]),
	}
}
