# METADATA
# custom:
#   mode: warn
package deployguard.team

# A team's own policy, installed from a file with helm --set-file.
deny contains {"msg": "add a team label: metadata.labels.team", "field": "metadata.labels.team"} if {
	not input.object.metadata.labels.team
}
