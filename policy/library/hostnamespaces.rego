# METADATA
# title: Host namespaces
# description: >-
#   The pod template shares none of the node's namespaces: hostNetwork, hostPID
#   and hostIPC let a pod see and reach everything else on the node.
# custom:
#   mode: warn
#   severity: high
#   category: Pod Security
package deployguard.hostnamespaces

# what each field shares, for the message.
shares := {
	"hostNetwork": "network",
	"hostPID": "process",
	"hostIPC": "IPC",
}

deny contains finding if {
	some field, namespace in shares
	input.object.spec.template.spec[field] == true
	finding := {
		"msg": sprintf(
			"the pod template sets %s: true, which shares the node's %s namespace with the pod: remove %s or set it to false",
			[field, namespace, field],
		),
		"field": sprintf("spec.template.spec.%s", [field]),
	}
}
