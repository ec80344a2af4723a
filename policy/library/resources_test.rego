package deployguard.resources

deployment(containers) := {"object": {"spec": {"template": {"spec": {"containers": containers}}}}}

test_requests_present_allowed if {
	count(deny) == 0 with input as deployment([{"name": "web", "resources": {"requests": {"cpu": "250m", "memory": "64Mi"}}}])
}

test_no_resources_one_finding if {
	findings := deny with input as deployment([{"name": "web"}])
	findings == {{
		"msg": "container \"web\" has no cpu or memory request: set resources.requests.cpu (for example \"100m\") and resources.requests.memory (for example \"128Mi\")",
		"field": "spec.template.spec.containers[0].resources.requests",
	}}
}

test_empty_resources_one_finding if {
	findings := deny with input as deployment([{"name": "web", "resources": {}}])
	count(findings) == 1
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
	{f.field | some f in findings} == {"spec.template.spec.containers[0].resources.requests.cpu"}
}

test_each_container_reported if {
	findings := deny with input as deployment([{"name": "web"}, {"name": "sidecar", "resources": {"requests": {"cpu": "1", "memory": "1Gi"}}}, {"name": "proxy"}])
	{f.field | some f in findings} == {
		"spec.template.spec.containers[0].resources.requests",
		"spec.template.spec.containers[2].resources.requests",
	}
}

test_init_containers_checked if {
	inp := {"object": {"spec": {"template": {"spec": {
		"containers": [{"name": "web", "resources": {"requests": {"cpu": "1", "memory": "1Gi"}}}],
		"initContainers": [{"name": "migrate", "resources": {"requests": {"memory": "1Gi"}}}],
	}}}}}
	findings := deny with input as inp
	{f.field | some f in findings} == {"spec.template.spec.initContainers[0].resources.requests.cpu"}
}

# A DELETE has no object: deleting a Deployment without requests is not
# judged.
test_delete_not_judged if {
	old := deployment([{"name": "web"}, {"name": "sidecar", "resources": {}}])
	count(deny) == 0 with input as {"operation": "DELETE", "object": null, "oldObject": old.object}
}
