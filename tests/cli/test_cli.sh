#!/usr/bin/env bash
# test_cli.sh FFPLAN FFRUN — the command lines as a user meets them: help and version, exit
# statuses (0 ok, 1 runtime, 2 bad input), no output file written or truncated on bad input,
# fmt --check, ffplan metrics, and ffrun --dry-run alone and under mpirun.
set -u
ffplan=$1
ffrun=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
failures=0
checks=0

expect_status() { # want description command...
  local want=$1 what=$2
  shift 2
  checks=$((checks + 1))
  "$@" >"$tmp/out" 2>"$tmp/err"
  local got=$?
  if [ "$got" != "$want" ]; then
    echo "FAIL: $what: exit status $got, expected $want"
    sed 's/^/  | /' "$tmp/out" "$tmp/err" | head -20
    failures=$((failures + 1))
  fi
}

expect_grep() { # file pattern description
  checks=$((checks + 1))
  if ! grep -q -- "$2" "$1"; then
    echo "FAIL: $3: no line matching '$2' in:"
    sed 's/^/  | /' "$1" | head -20
    failures=$((failures + 1))
  fi
}

expect_status 0 "ffplan --help" "$ffplan" --help
expect_grep "$tmp/out" "validate FILE" "ffplan --help lists validate"
expect_status 0 "ffplan --version" "$ffplan" --version
expect_grep "$tmp/out" "^ffplan [0-9]" "ffplan --version prints the version"
expect_status 0 "ffrun --help" "$ffrun" --help
expect_status 0 "ffrun --version" "$ffrun" --version
expect_grep "$tmp/out" "^ffrun [0-9]" "ffrun --version prints the version"
expect_status 2 "ffplan with no command" "$ffplan"
expect_status 2 "ffplan unknown command" "$ffplan" frobnicate
expect_status 2 "ffplan validate without files" "$ffplan" validate

# Every shipped file validates, with one summary line each.
expect_status 0 "validate every shipped profile" "$ffplan" validate profiles/*/*.json
count=$(ls profiles/*/*.json | wc -l)
checks=$((checks + 1))
if [ "$(grep -c ': ok: ' "$tmp/out")" != "$count" ]; then
  echo "FAIL: expected $count summary lines"; failures=$((failures + 1))
fi

# Bad input: status 2, message with file and path, and no output written.
printf '{"format": "ff-model/1", "name": "m", "layers": 0}' >"$tmp/bad.json"
expect_status 2 "validate a bad model" "$ffplan" validate "$tmp/bad.json"
expect_grep "$tmp/err" "bad.json: layers: 0 is out of range" "the error names file and path"
expect_status 2 "fmt of a bad file" "$ffplan" fmt "$tmp/bad.json" -o "$tmp/new.json"
checks=$((checks + 1))
[ -e "$tmp/new.json" ] && { echo "FAIL: fmt wrote output for bad input"; failures=$((failures + 1)); }
echo "precious" >"$tmp/keep.json"
expect_status 2 "fmt of a bad file over an existing output" "$ffplan" fmt "$tmp/bad.json" -o "$tmp/keep.json"
checks=$((checks + 1))
[ "$(cat "$tmp/keep.json")" = "precious" ] || { echo "FAIL: existing output was changed"; failures=$((failures + 1)); }
checks=$((checks + 1))
ls "$tmp" | grep -q '\.tmp\.' && { echo "FAIL: a temporary file was left behind"; failures=$((failures + 1)); }
expect_status 2 "validate a missing file" "$ffplan" validate "$tmp/none.json"
expect_grep "$tmp/err" "cannot open" "a missing file says it cannot be opened"
expect_status 2 "validate a directory" "$ffplan" validate "$tmp"
expect_status 2 "a bad file among good ones" "$ffplan" validate profiles/models/tiny.json "$tmp/bad.json"
expect_grep "$tmp/out" "tiny.json: ok" "good files are still summarised"

# fmt: canonical output, --check, --in-place.
sed 's/  / /g' profiles/models/tiny.json >"$tmp/tiny.json"
expect_status 1 "fmt --check of a non-canonical file" "$ffplan" fmt --check "$tmp/tiny.json"
expect_grep "$tmp/err" "not in canonical form" "fmt --check says why"
expect_status 0 "fmt --in-place" "$ffplan" fmt --in-place "$tmp/tiny.json"
checks=$((checks + 1))
cmp -s "$tmp/tiny.json" profiles/models/tiny.json || { echo "FAIL: fmt --in-place did not restore the canonical bytes"; failures=$((failures + 1)); }
expect_status 0 "fmt --check of shipped files" "$ffplan" fmt --check profiles/*/*.json

# simulate explains every shipped plan; --json has the documented keys.
for plan in profiles/plans/*.json; do
  expect_status 0 "simulate $plan" "$ffplan" simulate "$plan"
  expect_grep "$tmp/out" "critical path" "simulate names the critical path of $plan"
done
expect_status 0 "simulate --json" "$ffplan" simulate --json profiles/plans/tiny-asym.json
for key in iteration_seconds tokens_per_second mfu hfu model_flops_per_iteration; do
  expect_grep "$tmp/out" "\"$key\"" "simulate --json has $key"
done

# A plan that describes Megatron-LM's attention (for comparing runs of that framework) simulates,
# slower here than with ffrun's own GEMM kernel (every score, more passes; under bf16 its scores
# are half the bytes, so that is this plan's shape, not a rule).
python3 - profiles/plans/flashflex-b-llama-2-7b.json "$tmp/attn" <<'PY'
import json, sys
p = json.load(open(sys.argv[1]))
p["inputs"].pop("digests", None)
for kind in ("gemm", "megatron"):
    p["inputs"]["training"]["attention"] = kind
    json.dump(p, open(f"{sys.argv[2]}-{kind}.json", "w"), indent=2)
PY
for kind in gemm megatron; do
  expect_status 0 "simulate with attention $kind" "$ffplan" simulate --json "$tmp/attn-$kind.json"
  sed -n 's/.*"iteration_seconds": \([0-9.e+-]*\).*/\1/p' "$tmp/out" | head -1 >"$tmp/attn-$kind.t"
done
checks=$((checks + 1))
awk -v g="$(cat "$tmp/attn-gemm.t")" -v m="$(cat "$tmp/attn-megatron.t")" \
  'BEGIN { exit !(g > 0 && m > g) }' ||
  { echo "FAIL: megatron attention not slower than gemm:" \
      "$(cat "$tmp/attn-megatron.t") vs $(cat "$tmp/attn-gemm.t")"; failures=$((failures + 1)); }

# The same plan with bf16 activations on the wire (frameworks that send them so) moves half the
# bytes across its 10 GbE stage boundaries: faster. ffrun's own fp32 wire is the default.
python3 - profiles/plans/flashflex-b-llama-2-7b.json "$tmp/wire-bf16.json" <<'PY'
import json, sys
p = json.load(open(sys.argv[1]))
p["inputs"].pop("digests", None)
p["inputs"]["training"]["wire"] = "bf16"
json.dump(p, open(sys.argv[2], "w"), indent=2)
PY
expect_status 0 "simulate with wire bf16" "$ffplan" simulate --json "$tmp/wire-bf16.json"
sed -n 's/.*"iteration_seconds": \([0-9.e+-]*\).*/\1/p' "$tmp/out" | head -1 >"$tmp/wire-bf16.t"
expect_status 0 "simulate with wire fp32" "$ffplan" simulate --json profiles/plans/flashflex-b-llama-2-7b.json
sed -n 's/.*"iteration_seconds": \([0-9.e+-]*\).*/\1/p' "$tmp/out" | head -1 >"$tmp/wire-fp32.t"
checks=$((checks + 1))
awk -v b="$(cat "$tmp/wire-bf16.t")" -v f="$(cat "$tmp/wire-fp32.t")" \
  'BEGIN { exit !(b > 0 && f > b) }' ||
  { echo "FAIL: bf16 wire not faster than fp32: $(cat "$tmp/wire-bf16.t") vs $(cat "$tmp/wire-fp32.t")"
    failures=$((failures + 1)); }

# plan: writes a valid plan atomically; bad input 2; nothing fits 3 without an output file.
expect_status 0 "ffplan plan" "$ffplan" plan --cluster profiles/clusters/cpu-local.json \
  --model profiles/models/tiny.json --training profiles/training/tiny.json -o "$tmp/planned.json"
expect_grep "$tmp/err" "predicted" "ffplan plan prints a summary line"
expect_status 0 "a planned plan validates" "$ffplan" validate "$tmp/planned.json"
expect_status 0 "a planned plan is canonical" "$ffplan" fmt --check "$tmp/planned.json"
expect_status 2 "ffplan plan without inputs" "$ffplan" plan --cluster profiles/clusters/cpu-local.json
expect_status 2 "ffplan plan with a bad model" "$ffplan" plan --cluster profiles/clusters/cpu-local.json \
  --model "$tmp/bad.json" --training profiles/training/tiny.json -o "$tmp/none.json"
expect_status 3 "ffplan plan of a model that fits nowhere" "$ffplan" plan \
  --cluster profiles/clusters/cpu-local.json --model profiles/models/llama-2-70b.json \
  --training profiles/training/tiny.json -o "$tmp/none.json"
expect_grep "$tmp/err" "model states need" "an infeasible plan says why"
checks=$((checks + 1))
[ -e "$tmp/none.json" ] && { echo "FAIL: a failed plan wrote output"; failures=$((failures + 1)); }

# ffplan metrics: a run's metrics through the strict reader, summarised or as columns; a bad
# line is named by file and line, with exit status 2.
expect_status 0 "ffrun, 3 steps with metrics" "$ffrun" tests/plans/one-rank.json --text LICENSE \
  --steps 3 --quiet --metrics "$tmp/run.jsonl" --eval-data README.md --eval-every 2 --eval-batches 1
expect_status 0 "ffplan metrics (summary)" "$ffplan" metrics "$tmp/run.jsonl"
expect_grep "$tmp/out" "3 steps (1 to 3) on 1 rank" "the summary counts the steps"
expect_grep "$tmp/out" "predicted .* %)" "the summary sets the prediction against the run"
expect_grep "$tmp/out" "validation loss .* (step 2) -> .* (step 3), perplexity .*, 512 tokens" \
  "the summary gives the first and last validation"
expect_status 0 "ffplan metrics --get val_loss" "$ffplan" metrics "$tmp/run.jsonl" \
  --get step,val_loss,val_perplexity,val_tokens
checks=$((checks + 1))
python3 - "$tmp/run.jsonl" "$tmp/out" <<'PY' || { echo "FAIL: --get val_* differs from the file"; failures=$((failures + 1)); }
import json, math, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[2])]
assert [r[0] for r in rows] == ["1", "2", "3"], rows
assert rows[0][1:] == ["null", "null", "0"], rows[0]
for j, r in zip(lines[1:], rows[1:]):
    assert float(r[1]) == j["val_loss"] and int(r[3]) == j["val_tokens"] == 512, (j, r)
    assert abs(float(r[2]) - math.exp(j["val_loss"])) <= 1e-6 * float(r[2]), (j, r)
PY
expect_status 0 "ffplan metrics --get" "$ffplan" metrics "$tmp/run.jsonl" --get step,loss,ranks
checks=$((checks + 1))
if ! python3 - "$tmp/run.jsonl" "$tmp/out" <<'PY'; then
import json, sys
want = [(j["step"], j["loss"], j["ranks"]) for j in map(json.loads, open(sys.argv[1]))]
got = [tuple(f(x) for f, x in zip((int, float, int), l.split("\t"))) for l in open(sys.argv[2])]
sys.exit(0 if got == want else 1)
PY
  echo "FAIL: --get differs from the file"
  failures=$((failures + 1))
fi
expect_status 0 "ffplan metrics --stages" "$ffplan" metrics "$tmp/run.jsonl" --stages \
  --get step,pipeline,stage,predicted_memory_gib
checks=$((checks + 1))
awk -F '\t' 'NF != 4 || $4 <= 0 { bad = 1 } END { exit bad || NR != 3 }' "$tmp/out" ||
  { echo "FAIL: --stages: expected 3 rows with a predicted memory"; failures=$((failures + 1)); }
expect_status 2 "ffplan metrics --get an unknown key" "$ffplan" metrics "$tmp/run.jsonl" --get lose
expect_grep "$tmp/err" "lose: not a key of a metrics line; the keys: step" \
  "the unknown key is named"
expect_status 2 "ffplan metrics --stages without --get" "$ffplan" metrics "$tmp/run.jsonl" --stages
sed '2s/"val_tokens": [0-9]*/"val_tokens": 0/' "$tmp/run.jsonl" >"$tmp/bad.jsonl"
expect_status 2 "ffplan metrics on a validation of no tokens" "$ffplan" metrics "$tmp/bad.jsonl"
expect_grep "$tmp/err" "bad.jsonl:2: val_tokens" "the bad validation is named by file, line and key"
sed '2s/"loss": [^,]*/"loss": "low"/' "$tmp/run.jsonl" >"$tmp/bad.jsonl"
expect_status 2 "ffplan metrics on a bad line" "$ffplan" metrics "$tmp/bad.jsonl" --get loss
expect_grep "$tmp/err" "bad.jsonl:2: loss" "the bad line is named by file, line and key"
expect_status 2 "ffplan metrics on a missing file" "$ffplan" metrics "$tmp/none.jsonl"

# ffrun --dry-run: one line per rank, alone and under mpirun.
expect_status 0 "ffrun --dry-run" "$ffrun" --dry-run profiles/plans/tiny-asym.json
checks=$((checks + 1))
[ "$(grep -vc '^#' "$tmp/out")" = 6 ] || { echo "FAIL: expected 6 rank lines"; cat "$tmp/out"; failures=$((failures + 1)); }
expect_grep "$tmp/out" "emb+head" "the role table shows what each stage holds"
expect_status 0 "ffrun --dry-run --backend cpu" "$ffrun" --dry-run --backend cpu profiles/plans/h100-8-llama-2-7b.json
expect_grep "$tmp/out" "backend: cpu" "--backend cpu is honoured"
expect_status 2 "ffrun on a bad plan" "$ffrun" --dry-run "$tmp/bad.json"
expect_status 2 "ffrun without --dry-run" "$ffrun" profiles/plans/tiny-asym.json
expect_status 2 "ffrun with a bad backend" "$ffrun" --dry-run --backend tpu profiles/plans/tiny-asym.json
if command -v mpirun >/dev/null; then
  # LeakSanitizer's tracer cannot follow Open MPI's threads; the MPI runs check everything else.
  export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
  expect_status 0 "mpirun -np 6 ffrun --dry-run" mpirun --oversubscribe -np 6 "$ffrun" --dry-run profiles/plans/tiny-asym.json
  expect_grep "$tmp/out" "6 MPI processes" "under mpirun every process reports its role"
  checks=$((checks + 1))
  [ "$(grep -vc '^#' "$tmp/out")" = 6 ] || { echo "FAIL: expected 6 rank lines under mpirun"; failures=$((failures + 1)); }
  checks=$((checks + 1))
  if mpirun --oversubscribe -np 2 "$ffrun" --dry-run profiles/plans/tiny-asym.json >"$tmp/out" 2>&1; then
    echo "FAIL: a launch with the wrong number of processes succeeded"; failures=$((failures + 1))
  fi
  expect_grep "$tmp/out" "the plan has 6 ranks but 2 processes" "a wrong process count is explained"
fi

echo "cli: $checks checks, $failures failed"
[ "$failures" -eq 0 ]
