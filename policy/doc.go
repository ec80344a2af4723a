// Package policy evaluates platform teams' Rego policies against Deployment
// admission requests.
//
// A policy set (the built-in library, a directory, labelled ConfigMaps) is
// compiled and prepared once per change and swapped in atomically, so
// evaluation never waits for a compile and a set that fails to compile never
// takes effect. The contract for policy authors is in README.md.
//
// The package imports nothing else of deployguard: the webhook and the offline
// "check" command build the same Input and get the same Decision.
package policy
