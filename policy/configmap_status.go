package policy

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"unicode/utf8"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Event reasons on policy ConfigMaps.
const (
	// ReasonPolicyRejected: the ConfigMap's modules failed to compile and its
	// rules are not in force.
	ReasonPolicyRejected = "PolicyRejected"
	// ReasonPolicyLoaded: a previously rejected ConfigMap now loads.
	ReasonPolicyLoaded = "PolicyLoaded"
)

// Size limits: an annotation should stay readable in kubectl describe, and
// events.k8s.io notes are at most 1 KiB.
const (
	maxAnnotationLen = 4096
	maxEventNoteLen  = 1000
)

// errorAnnotationValue is what the annotation should say for a load result:
// each error on its own line, "" when the ConfigMap loaded.
func errorAnnotationValue(lerr *LoadError) string {
	if lerr == nil {
		return ""
	}
	lines := make([]string, len(lerr.Errors))
	for i, se := range lerr.Errors {
		lines[i] = se.Error()
	}
	return truncate(strings.Join(lines, "\n")+"\n(the rules of this ConfigMap are not in force)", maxAnnotationLen)
}

// annotationChange says whether and how the annotation must change: nil for
// no change, a pointer to "" for removal, else the new value.
func annotationChange(annotations map[string]string, key, want string) *string {
	have, has := annotations[key]
	switch {
	case want == "" && !has, want != "" && has && have == want:
		return nil
	}
	return &want
}

// report brings the ConfigMap's error annotation and Events in line with its
// load result. Events are emitted only when the annotation changes, so one
// error gives one Event, however often the set is reloaded.
func (s *ConfigMapSource) report(ctx context.Context, cm *corev1.ConfigMap, lerr *LoadError) error {
	log := ctrl.LoggerFrom(ctx).WithValues("configMap", klog.KObj(cm))
	want := errorAnnotationValue(lerr)
	change := annotationChange(cm.Annotations, s.ErrorAnnotation, want)
	if lerr != nil {
		log.Info("Policy ConfigMap rejected; its rules are not in force", "reason", ReasonPolicyRejected, "error", lerr.Error())
	}
	if change == nil {
		return nil
	}
	if err := s.patchErrorAnnotation(ctx, cm, *change); err != nil {
		return err
	}
	if lerr != nil {
		s.Recorder.Eventf(cm, nil, corev1.EventTypeWarning, ReasonPolicyRejected, "LoadPolicy", "%s", truncate(want, maxEventNoteLen))
	} else {
		s.Recorder.Eventf(cm, nil, corev1.EventTypeNormal, ReasonPolicyLoaded, "LoadPolicy", "policies of this ConfigMap are in force")
		log.Info("Policy ConfigMap loaded again", "reason", ReasonPolicyLoaded)
	}
	return nil
}

// patchErrorAnnotation sets (or, for "", removes) the annotation with a merge
// patch: no resourceVersion, so it never conflicts with the ConfigMap's owner
// editing its data.
func (s *ConfigMapSource) patchErrorAnnotation(ctx context.Context, cm *corev1.ConfigMap, value string) error {
	var v any = value
	if value == "" {
		v = nil // null removes the key in a JSON merge patch
	}
	patch, err := json.Marshal(map[string]any{
		"metadata": map[string]any{"annotations": map[string]any{s.ErrorAnnotation: v}},
	})
	if err != nil {
		return fmt.Errorf("building annotation patch: %w", err)
	}
	if err := s.Client.Patch(ctx, cm, client.RawPatch(types.MergePatchType, patch)); err != nil {
		return fmt.Errorf("annotating policy ConfigMap %s: %w", klog.KObj(cm), err)
	}
	return nil
}

// truncate cuts s to at most n bytes, on a rune boundary, marking the cut.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	const mark = "…"
	cut := n - len(mark)
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + mark
}
