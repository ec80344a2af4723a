// Package native carries the guard's ValidatingAdmissionPolicies
// (policies.yaml) into the binary: the file kustomize and the Helm chart
// install is the one the guard evaluates in process (webhook/native).
package native

import _ "embed"

// Policies is policies.yaml, as installed.
//
//go:embed policies.yaml
var Policies []byte

// ParamsName is the name of the policies' params ConfigMap (params.yaml),
// in the guard's namespace.
const ParamsName = "deployguard-admission-params"
