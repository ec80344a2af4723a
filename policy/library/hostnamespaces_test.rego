package deployguard.hostnamespaces

deployment(podSpec) := {"object": {"spec": {"template": {"spec": podSpec}}}}

test_no_host_namespaces_allowed if {
	count(deny) == 0 with input as deployment({"containers": [{"name": "web"}]})
}

test_false_allowed if {
	count(deny) == 0 with input as deployment({"hostNetwork": false, "hostPID": false, "hostIPC": false})
}

test_host_network_denied if {
	findings := deny with input as deployment({"hostNetwork": true})
	findings == {{
		"msg": "the pod template sets hostNetwork: true, which shares the node's network namespace with the pod: remove hostNetwork or set it to false",
		"field": "spec.template.spec.hostNetwork",
	}}
}

test_each_namespace_reported if {
	findings := deny with input as deployment({"hostNetwork": true, "hostPID": true, "hostIPC": true})
	{f.field | some f in findings} == {
		"spec.template.spec.hostNetwork",
		"spec.template.spec.hostPID",
		"spec.template.spec.hostIPC",
	}
}

# A DELETE has no object: deleting a Deployment that shares every host
# namespace is not judged.
test_delete_not_judged if {
	old := deployment({"hostNetwork": true, "hostPID": true, "hostIPC": true})
	count(deny) == 0 with input as {"operation": "DELETE", "object": null, "oldObject": old.object}
}
