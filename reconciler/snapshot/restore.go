package snapshot

import (
	"fmt"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/deployguard/deployguard/reconciler/rollout"
)

// Now is one recorded config object as the guard reads it at rollback.
type Now struct {
	// Exists: the object the template names exists; Hash is its content's.
	Exists bool
	Hash   string
	// SnapshotOK: the recorded snapshot exists, is immutable and its data
	// hashes to the recorded hash, recomputed now.
	SnapshotOK bool
}

// Restore is a reference the rollback points at its snapshot.
type Restore struct {
	Kind, Name, Snapshot string
	// Gone: the object was deleted (or pruned) since the revision ran;
	// otherwise its data changed.
	Gone bool
}

// Lost is a referenced object whose config, as the revision ran with it,
// the rollback cannot bring back, and why.
type Lost struct {
	Kind, Name, Why string
}

// RestorePlan is what a rollback does about the config of the revision it
// restores.
type RestorePlan struct {
	Restore []Restore
	Lost    []Lost
}

// PlanRestore decides, for each object the known-good entry recorded
// (recs), whether the restored template points at its snapshot: only where
// the object drifted (its data changed, or it is gone) and the snapshot is
// still the one recorded. Where nothing drifted the template is restored as
// it ran, which lets the Deployment controller reuse the old ReplicaSet.
// now holds what the guard read at rollback, by Key; a record with no entry
// in now is read as gone, its snapshot too.
func PlanRestore(recs []rollout.ConfigSnapshot, now map[Key]Now) RestorePlan {
	var p RestorePlan
	for _, rec := range recs {
		n := now[Key{rec.Kind, rec.Name}]
		drifted := !n.Exists || n.Hash != rec.Hash
		lost := func(why string) { p.Lost = append(p.Lost, Lost{Kind: rec.Kind, Name: rec.Name, Why: why}) }
		switch {
		case rec.Absent:
			if n.Exists {
				lost("it did not exist when the revision ran; the restored pods read it as it is now")
			}
		case !drifted:
		case rec.Snapshot == "":
			lost(changedOrGone(n) + " and no snapshot was kept (" + rec.Skipped + ")")
		case rec.Snapshot == rec.Name:
			// The template references a snapshot already: nothing to point
			// elsewhere, and the snapshot is not what was recorded.
			lost("the snapshot it is " + changedOrGone(n))
		case !n.SnapshotOK:
			lost(changedOrGone(n) + " and its snapshot " + rec.Snapshot + " is gone or no longer holds the recorded data")
		default:
			p.Restore = append(p.Restore, Restore{Kind: rec.Kind, Name: rec.Name, Snapshot: rec.Snapshot, Gone: !n.Exists})
		}
	}
	return p
}

func changedOrGone(n Now) string {
	if !n.Exists {
		return "was deleted since"
	}
	return "changed since"
}

// Rewrite returns t with every reference to an object of restores pointing
// at its snapshot instead: env valueFrom, envFrom, volumes and projected
// sources, of every container, init and ephemeral container. Nothing else
// changes (keys, optional, mount paths). t is not modified.
func Rewrite(t *corev1.PodTemplateSpec, restores []Restore) *corev1.PodTemplateSpec {
	out := t.DeepCopy()
	if len(restores) == 0 {
		return out
	}
	to := map[Key]string{}
	for _, r := range restores {
		to[Key{r.Kind, r.Name}] = r.Snapshot
	}
	rename := func(kind string, name *string) {
		if s, ok := to[Key{kind, *name}]; ok {
			*name = s
		}
	}
	spec := &out.Spec
	containers := func(env []corev1.EnvVar, envFrom []corev1.EnvFromSource) {
		for i := range env {
			if vf := env[i].ValueFrom; vf != nil {
				if r := vf.ConfigMapKeyRef; r != nil {
					rename(KindConfigMap, &r.Name)
				}
				if r := vf.SecretKeyRef; r != nil {
					rename(KindSecret, &r.Name)
				}
			}
		}
		for i := range envFrom {
			if r := envFrom[i].ConfigMapRef; r != nil {
				rename(KindConfigMap, &r.Name)
			}
			if r := envFrom[i].SecretRef; r != nil {
				rename(KindSecret, &r.Name)
			}
		}
	}
	forEachContainer(spec, containers)
	for i := range spec.Volumes {
		v := &spec.Volumes[i]
		if c := v.ConfigMap; c != nil {
			rename(KindConfigMap, &c.Name)
		}
		if s := v.Secret; s != nil {
			rename(KindSecret, &s.SecretName)
		}
		if pr := v.Projected; pr != nil {
			for j := range pr.Sources {
				if c := pr.Sources[j].ConfigMap; c != nil {
					rename(KindConfigMap, &c.Name)
				}
				if s := pr.Sources[j].Secret; s != nil {
					rename(KindSecret, &s.Name)
				}
			}
		}
	}
	return out
}

// Sentence says, for the rollback's Event and status, which config was
// restored from which snapshot and which could not be; empty when there is
// nothing to say. It begins with a space, to follow a sentence.
func (p RestorePlan) Sentence() string {
	var b strings.Builder
	if len(p.Restore) > 0 {
		parts := make([]string, 0, len(p.Restore))
		for _, r := range p.Restore {
			how := "changed since"
			if r.Gone {
				how = "deleted since"
			}
			parts = append(parts, fmt.Sprintf("%s %s from snapshot %s (%s)", r.Kind, r.Name, r.Snapshot, how))
		}
		b.WriteString(" Config restored: " + strings.Join(parts, ", ") + ".")
	}
	if len(p.Lost) > 0 {
		parts := make([]string, 0, len(p.Lost))
		for _, l := range p.Lost {
			parts = append(parts, fmt.Sprintf("%s %s (%s)", l.Kind, l.Name, l.Why))
		}
		b.WriteString(" Config not restored: " + strings.Join(parts, ", ") + ".")
	}
	return b.String()
}

func itoa(n int) string { return strconv.Itoa(n) }

// bytesString renders a bound in KiB or MiB.
func bytesString(n int) string {
	switch {
	case n >= 1<<20 && n%(1<<20) == 0:
		return itoa(n>>20) + " MiB"
	case n >= 1<<10 && n%(1<<10) == 0:
		return itoa(n>>10) + " KiB"
	}
	return itoa(n) + " bytes"
}
