#!/usr/bin/env bash
# test_review.sh FFPLAN — the plan review commands as a specification:
#  * show prints every shipped plan; its output for the golden plans is byte-identical to
#    tests/data/golden/*.show (update deliberately: `ffplan show PLAN > tests/data/golden/X.show`
#    after checking the new output by eye);
#  * check accepts every shipped plan and rejects each broken plan of tests/data/check/ (one
#    defect each; NAME.args holds extra arguments) with status 2 and the message in NAME.expect;
#  * diff reports known changes with status 1 and the same plan with status 0, also when only
#    identical nodes are permuted;
#  * a one-GPU edit of the cluster a plan embeds changes only a few lines of the canonical plan.
set -u
ffplan=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failures=0
checks=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
run() { "$@" >"$tmp/out" 2>"$tmp/err"; echo $?; }

# ---- show ----
for plan in profiles/plans/*.json; do
  checks=$((checks + 1))
  [ "$(run "$ffplan" show "$plan")" = 0 ] || fail "show $plan"
  grep -q "^predicted:" "$tmp/out" || fail "show $plan has no predicted line"
done
for golden in tests/data/golden/*.show; do
  name=$(basename "$golden" .show)
  checks=$((checks + 1))
  "$ffplan" show "profiles/plans/$name.json" >"$tmp/show" 2>&1
  cmp -s "$tmp/show" "$golden" || { fail "show $name differs from $golden:"; diff "$golden" "$tmp/show" | head -10; }
done
checks=$((checks + 1))
[ "$(run "$ffplan" show)" = 2 ] || fail "show without a plan is a usage error"

# ---- check ----
for plan in profiles/plans/*.json; do
  checks=$((checks + 1))
  [ "$(run "$ffplan" check "$plan")" = 0 ] || { fail "check $plan"; cat "$tmp/err"; }
done
checks=$((checks + 1))
[ "$(run "$ffplan" check profiles/plans/flashflex-b-llama-2-7b.json --cluster profiles/clusters/flashflex-b.json --model profiles/models/llama-2-7b.json)" = 0 ] ||
  fail "check against the files the plan was made from"
cases=0
for plan in tests/data/check/*.json; do
  name=${plan%.json}
  args=()
  [ -f "$name.args" ] && read -r -a args <"$name.args"
  cases=$((cases + 1))
  checks=$((checks + 1))
  status=$(run "$ffplan" check "$plan" "${args[@]}")
  if [ "$status" != 2 ]; then
    fail "check $(basename "$plan"): status $status, expected 2"
  elif ! grep -qF -- "$(cat "$name.expect")" "$tmp/err"; then
    fail "check $(basename "$plan"): expected message not found: $(cat "$name.expect")"
    sed 's/^/  | /' "$tmp/err" | head -5
  fi
done
[ "$cases" -ge 12 ] || fail "the check corpus has only $cases cases"

# ---- diff ----
base=tests/data/diff/base/flashflex-b-llama-2-7b.json # the shipped example as first planned; the pairs edit it
checks=$((checks + 1))
[ "$(run "$ffplan" diff "$base" "$base")" = 0 ] && grep -q "^same plan$" "$tmp/out" || fail "diff of a plan with itself"
for pair in tests/data/diff/*.json; do
  name=${pair%.json}
  want=$(cat "$name.status")
  checks=$((checks + 1))
  status=$(run "$ffplan" diff "$base" "$pair")
  [ "$status" = "$want" ] || fail "diff $(basename "$pair"): status $status, expected $want"
  while IFS= read -r line; do
    checks=$((checks + 1))
    grep -qF -- "$line" "$tmp/out" || { fail "diff $(basename "$pair"): no line '$line' in:"; sed 's/^/  | /' "$tmp/out"; }
  done <"$name.expect"
done
checks=$((checks + 1))
[ "$(run "$ffplan" diff --json "$base" tests/data/diff/layer-move.json)" = 1 ] && grep -q '"same": false' "$tmp/out" ||
  fail "diff --json says the plans differ"
checks=$((checks + 1))
[ "$(run "$ffplan" diff "$base")" = 2 ] || fail "diff with one plan is a usage error"

# ---- small diffs: a one-GPU edit of the embedded cluster ----
python3 - "$base" "$tmp/edited.json" <<'PY'
import json, sys
plan = json.load(open(sys.argv[1]))
for node in plan["inputs"]["cluster"]["nodes"]:
    if node["name"] == "n4090":
        node["intra_latency_us"] = 12  # one node's GPU-to-GPU link
del plan["inputs"]["digests"]
json.dump(plan, open(sys.argv[2], "w"))
PY
"$ffplan" fmt "$tmp/edited.json" -o "$tmp/canonical.json"
changed=$(diff "$base" "$tmp/canonical.json" | grep -c '^[<>]')
total=$(wc -l <"$base")
checks=$((checks + 1))
[ "$changed" -ge 2 ] && [ "$changed" -le 6 ] || fail "a one-node edit changed $changed of $total lines (expected the node line and the digest)"

echo "review: $checks checks, $failures failed"
[ "$failures" -eq 0 ]
