package deployguard.images

deployment(containers) := {"object": {"spec": {"template": {"spec": {"containers": containers}}}}}

test_version_tag_allowed if {
	count(deny) == 0 with input as deployment([{"name": "web", "image": "nginx:1.27.1"}])
}

test_digest_allowed if {
	count(deny) == 0 with input as deployment([{"name": "web", "image": "nginx@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"}])
}

test_latest_with_digest_allowed if {
	count(deny) == 0 with input as deployment([{"name": "web", "image": "nginx:latest@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"}])
}

test_latest_denied if {
	findings := deny with input as deployment([{"name": "web", "image": "nginx:latest"}])
	findings == {{
		"msg": "image \"nginx:latest\" of container \"web\" uses the mutable tag \"latest\": set a version tag (nginx:<version>) or pin a digest (nginx@sha256:<digest>)",
		"field": "spec.template.spec.containers[0].image",
	}}
}

test_untagged_denied if {
	findings := deny with input as deployment([{"name": "web", "image": "nginx:1.27"}, {"name": "sidecar", "image": "envoyproxy/envoy"}])
	count(findings) == 1
	some finding in findings
	finding.field == "spec.template.spec.containers[1].image"
	contains(finding.msg, "container \"sidecar\" has no tag")
}

test_registry_port_is_not_a_tag if {
	findings := deny with input as deployment([{"name": "web", "image": "registry.local:5000/team/web"}])
	count(findings) == 1
}

test_registry_port_with_tag_allowed if {
	count(deny) == 0 with input as deployment([{"name": "web", "image": "registry.local:5000/team/web:2.0.1"}])
}

test_init_containers_checked if {
	inp := {"object": {"spec": {"template": {"spec": {
		"containers": [{"name": "web", "image": "nginx:1.27.1"}],
		"initContainers": [{"name": "migrate", "image": "migrate:latest"}],
	}}}}}
	findings := deny with input as inp
	{f.field | some f in findings} == {"spec.template.spec.initContainers[0].image"}
}

test_delete_has_no_object if {
	count(deny) == 0 with input as {"operation": "DELETE", "object": null}
}

# Deleting a Deployment whose images are untagged and :latest is not judged.
test_delete_not_judged if {
	old := deployment([{"name": "web", "image": "nginx"}, {"name": "sidecar", "image": "envoy:latest"}])
	count(deny) == 0 with input as {"operation": "DELETE", "object": null, "oldObject": old.object}
}
