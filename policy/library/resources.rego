# METADATA
# title: Resource requests
# description: >-
#   Every container and init container requests cpu and memory. The scheduler
#   places pods by their requests; a pod without them can land on a full node
#   and be the first one evicted.
# custom:
#   mode: warn
#   severity: medium
#   category: Resources
package deployguard.resources

# example is the value suggested in the message for a missing request.
example := {"cpu": "100m", "memory": "128Mi"}

# missing(container) is the sorted list of resources the container does not
# request. An empty string counts as absent: the API server would refuse it
# anyway, and "check" sees manifests before the API server does.
missing(container) := sort([resource |
	some resource, _ in example
	object.get(container, ["resources", "requests", resource], "") == ""
])

# One finding per container, naming every missing request: one problem, one
# message.
deny contains finding if {
	some kind in {"containers", "initContainers"}
	some i, container in input.object.spec.template.spec[kind]
	absent := missing(container)
	count(absent) > 0
	finding := {
		"msg": sprintf(
			"container %q has no %s request: set %s",
			[container.name, concat(" or ", absent), concat(" and ", [sprintf("resources.requests.%s (for example %q)", [r, example[r]]) | some r in absent])],
		),
		"field": field_of(kind, i, absent),
	}
}

field_of(kind, i, absent) := sprintf("spec.template.spec.%s[%d].resources.requests.%s", [kind, i, absent[0]]) if count(absent) == 1

field_of(kind, i, absent) := sprintf("spec.template.spec.%s[%d].resources.requests", [kind, i]) if count(absent) > 1
