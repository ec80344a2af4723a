# METADATA
# title: Readiness probes
# description: >-
#   Every container has a readinessProbe. Without one a pod counts as ready as
#   soon as it starts, so a rolling update can replace working pods with pods
#   that do not serve yet, and the progress deadline cannot catch it.
# custom:
#   mode: warn
#   severity: medium
#   category: Reliability
package deployguard.probes

deny contains finding if {
	some i, container in input.object.spec.template.spec.containers
	not container.readinessProbe
	finding := {
		"msg": sprintf(
			"container %q has no readinessProbe: add one (httpGet, tcpSocket, grpc or exec), or a rollout of pods that cannot serve completes anyway and is never rolled back",
			[container.name],
		),
		"field": sprintf("spec.template.spec.containers[%d].readinessProbe", [i]),
	}
}
