# METADATA
# title: Resource requests
# description: >-
#   Every container and init container requests cpu and memory. The scheduler
#   places pods by their requests; a pod without them can land on a full node
#   and be the first one evicted.
# custom:
#   mode: enforce
package deployguard.resources

# example is the value suggested in the message for a missing request.
example := {"cpu": "100m", "memory": "128Mi"}

# An empty string counts as absent: the API server would refuse it anyway,
# and "check" sees manifests before the API server does.
deny contains finding if {
	some kind in {"containers", "initContainers"}
	some i, container in input.object.spec.template.spec[kind]
	some resource, suggestion in example
	object.get(container, ["resources", "requests", resource], "") == ""
	finding := {
		"msg": sprintf(
			"container %q has no %s request: set resources.requests.%s (for example %q)",
			[container.name, resource, resource, suggestion],
		),
		"field": sprintf("spec.template.spec.%s[%d].resources.requests.%s", [kind, i, resource]),
	}
}
