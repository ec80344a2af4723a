#!/usr/bin/env bash
# Runs every fuzz target for FUZZTIME each and prints, per target, the inputs
# run, the rate (over FUZZTIME, and over the time spent fuzzing once the
# corpus's baseline coverage is gathered) and the result. A crash stops
# nothing else: Go writes the failing input to the package's
# testdata/fuzz/<target>/, where `make test` replays it for ever once it is
# committed with its fix.
#
# -fuzzminimizetime is bounded in iterations: Go's minimizer is quadratic in
# the input's length, and with its default budget (60 s per new interesting
# input) the workers spend most of a run minimizing, not fuzzing (0 execs/s).
set -uo pipefail
cd "$(dirname "$0")/../.."
fuzztime="${FUZZTIME:-60s}"
minimize="${FUZZMINIMIZE:-100x}"
targets=(
	"./webhook FuzzHandlers"
	"./webhook FuzzDeployment"
	"./webhook FuzzDecoding"
	"./policy FuzzBuiltins"
	"./policy FuzzLoad"
	"./policy FuzzJSONValue"
	"./cmd/deployguard/config FuzzParse"
	"./cmd/deployguard/commands/check FuzzReadDocuments"
	"./certs FuzzPEM"
)
out="bin/fuzz"
mkdir -p "$out"
summary=()
failed=0
for t in "${targets[@]}"; do
	read -r pkg fn <<<"$t"
	log="$out/$fn.log"
	echo ">> $fn ($pkg) for $fuzztime"
	start=$(date +%s)
	go test -run '^$' -fuzz "^${fn}\$" -fuzztime "$fuzztime" -fuzzminimizetime "$minimize" "$pkg" >"$log" 2>&1
	rc=$?
	secs=$(( $(date +%s) - start ))
	execs=$(grep -o 'execs: [0-9]*' "$log" | tail -1 | grep -o '[0-9]*' || true)
	corpus=$(grep -o 'total: [0-9]*' "$log" | tail -1 | grep -o '[0-9]*' || true)
	result="ok"
	if [ "$rc" -ne 0 ]; then
		failed=1
		result="FAILED (see $log; the input is in ${pkg#./}/testdata/fuzz/$fn/)"
		tail -30 "$log"
	fi
	rate=$(awk -v e="${execs:-0}" -v f="$fuzztime" 'BEGIN { s = f + 0; if (f ~ /m$/) s *= 60; if (s > 0) printf "%d", e / s; else print 0 }')
	# Go counts inputs once the corpus has been run for its baseline
	# coverage, which takes a good part of a short run once the cache holds
	# a few hundred inputs: the rate while fuzzing is over the time after it.
	baseline=$(grep -o 'elapsed: [0-9ms.]*, gathering baseline coverage: .*now fuzzing' "$log" | tail -1 | grep -o 'elapsed: [0-9ms.]*' | sed 's/elapsed: //')
	fuzzing=$(awk -v e="${execs:-0}" -v f="$fuzztime" -v b="${baseline:-0s}" 'function secs(d,  m) { m = 0; if (d ~ /m/) { m = d; sub(/m.*/, "", m); sub(/^[0-9]+m/, "", d) } return m * 60 + d } BEGIN { s = secs(f) - secs(b); if (s > 0) printf "%d", e / s; else print 0 }')
	summary+=("$(printf '%-18s %-26s %10s %8s/s %8s/s %7s  %s' "$fn" "${pkg#./}" "${execs:-0}" "$rate" "$fuzzing" "${corpus:-0}" "$result")")
done
echo
printf '%-18s %-26s %10s %10s %10s %7s  %s\n' TARGET PACKAGE INPUTS RATE FUZZING CORPUS RESULT
printf '%s\n' "${summary[@]}"
exit "$failed"
