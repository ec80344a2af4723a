package deployguard.resources

deployment(containers) := {"object": {"spec": {"template": {"spec": {"containers": containers}}}}}

test_requests_present_allowed if {
	count(deny) == 0 with input as deployment([{"name": "web", "resources": {"requests": {"cpu": "250m", "memory": "64Mi"}}}])
}

test_no_resources_denied_twice if {
	findings := deny with input as deployment([{"name": "web"}])
	{f.field | some f in findings} == {
		"spec.template.spec.containers[0].resources.requests.cpu",
		"spec.template.spec.containers[0].resources.requests.memory",
	}
}

test_missing_memory_message if {
	findings := deny with input as deployment([{"name": "web", "resources": {"requests": {"cpu": "1"}, "limits": {"memory": "1Gi"}}}])
	findings == {{
		"msg": "container \"web\" has no memory request: set resources.requests.memory (for example \"128Mi\")",
		"field": "spec.template.spec.containers[0].resources.requests.memory",
	}}
}

test_empty_request_denied if {
	findings := deny with input as deployment([{"name": "web", "resources": {"requests": {"cpu": "", "memory": "64Mi"}}}])
	count(findings) == 1
}

test_init_containers_checked if {
	inp := {"object": {"spec": {"template": {"spec": {
		"containers": [{"name": "web", "resources": {"requests": {"cpu": "1", "memory": "1Gi"}}}],
		"initContainers": [{"name": "migrate", "resources": {"requests": {"memory": "1Gi"}}}],
	}}}}}
	findings := deny with input as inp
	{f.field | some f in findings} == {"spec.template.spec.initContainers[0].resources.requests.cpu"}
}
