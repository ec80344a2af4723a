package deployguard.probes

deployment(containers) := {"object": {"spec": {"template": {"spec": {"containers": containers}}}}}

test_probe_present_allowed if {
	count(deny) == 0 with input as deployment([{"name": "web", "readinessProbe": {"httpGet": {"path": "/healthz", "port": 8080}}}])
}

test_missing_probe_named if {
	findings := deny with input as deployment([
		{"name": "web", "readinessProbe": {"tcpSocket": {"port": 8080}}},
		{"name": "sidecar"},
	])
	findings == {{
		"msg": "container \"sidecar\" has no readinessProbe: add one (httpGet, tcpSocket, grpc or exec), or a rollout of pods that cannot serve completes anyway and is never rolled back",
		"field": "spec.template.spec.containers[1].readinessProbe",
	}}
}

test_init_containers_need_no_probe if {
	inp := {"object": {"spec": {"template": {"spec": {
		"containers": [{"name": "web", "readinessProbe": {"exec": {"command": ["true"]}}}],
		"initContainers": [{"name": "migrate"}],
	}}}}}
	count(deny) == 0 with input as inp
}

# A DELETE has no object: deleting a Deployment without probes is not judged.
test_delete_not_judged if {
	old := deployment([{"name": "web"}])
	count(deny) == 0 with input as {"operation": "DELETE", "object": null, "oldObject": old.object}
}
