#!/usr/bin/env bash
# test_scale.sh FFPLAN GEN_CLUSTER [plain|sanitized] — planner inputs at the edges of the formats
# (docs/reliability.md, Inputs at scale): each is planned or refused with a clear message, never
# an allocation failure, an overflow or a hang.
set -u
ffplan=$1
gen=$2
mode=${3:-plain}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failures=0
checks=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
expect() { # expect STATUS PATTERN -- command...: the exit status and a line of its stderr
  local want=$1 pattern=$2
  shift 3
  checks=$((checks + 1))
  timeout 600 "$@" >"$tmp/out" 2>"$tmp/err"
  local got=$?
  if [ "$got" != "$want" ] || { [ -n "$pattern" ] && ! grep -q -- "$pattern" "$tmp/err"; }; then
    fail "$* -> status $got (expected $want), stderr:"
    sed 's/^/    /' "$tmp/err" | head -5
  fi
}

python3 - "$tmp" <<'PY'
import json, sys
tmp = sys.argv[1]
t = json.load(open("profiles/training/pretrain.json"))
for gb in (1, 10**9):
    json.dump(dict(t, global_batch=gb), open(f"{tmp}/gb{gb}.json", "w"))
m = json.load(open("profiles/models/llama-2-7b.json"))
json.dump(dict(m, name="llama-10k-layers", layers=10000), open(f"{tmp}/layers10k.json", "w"))
json.dump(dict(m, name="narrow-10k-layers", layers=10000, hidden=512, heads=8, kv_heads=8,
               ffn_hidden=1376), open(f"{tmp}/narrow10k.json", "w"))
PY

# A global batch of 10^9 sequences: refused before searching, naming the limit.
expect 2 "gb1000000000.json: global_batch 1000000000 .* the planner handles at most 1048576" -- \
  "$ffplan" plan --cluster profiles/clusters/flashflex-b.json --model profiles/models/llama-2-7b.json \
  --training "$tmp/gb1000000000.json" -o "$tmp/p.json"
[ -e "$tmp/p.json" ] && fail "a refused plan left a file"
# A global batch of 1: one pipeline, one micro-batch.
expect 0 "1 pipelines" -- "$ffplan" plan --cluster profiles/clusters/flashflex-b.json \
  --model profiles/models/llama-2-7b.json --training "$tmp/gb1.json" -o "$tmp/p1.json"
expect 0 "" -- "$ffplan" check "$tmp/p1.json"
# 10,000 layers (2 T parameters) on 32 GPUs: no plan fits, and it says why.
expect 3 "no plan fits: model states need .* GiB per replica" -- "$ffplan" plan \
  --cluster profiles/clusters/flashflex-b.json --model "$tmp/layers10k.json" \
  --training profiles/training/pretrain.json -o "$tmp/p10k.json"
# 10,000 narrow layers do fit, and are planned.
expect 0 "ranks in .* pipelines, predicted" -- "$ffplan" plan --cluster profiles/clusters/flashflex-b.json \
  --model "$tmp/narrow10k.json" --training profiles/training/pretrain.json -o "$tmp/pn.json"
expect 0 "" -- "$ffplan" check "$tmp/pn.json"
# 100,000 GPUs: read, validated and summarised.
"$gen" --gpus 100000 -o "$tmp/c100k.json" >/dev/null 2>&1 || fail "gen_cluster --gpus 100000"
expect 0 "" -- "$ffplan" validate "$tmp/c100k.json"
# 100,000 GPUs with 10,000 layers: beyond the search's stage-count limit, refused up front.
expect 2 "100000 GPUs and 10000 layers .* the planner handles at most 16777216" -- "$ffplan" plan \
  --cluster "$tmp/c100k.json" --model "$tmp/layers10k.json" \
  --training profiles/training/pretrain.json -o "$tmp/p.json"
[ -e "$tmp/p.json" ] && fail "a refused plan left a file"
# ... and planned (about 2.4 minutes in the plain build; the sanitized build skips this one).
if [ "$mode" = plain ]; then
  expect 0 "ranks in .* pipelines, predicted" -- "$ffplan" plan --cluster "$tmp/c100k.json" \
    --model profiles/models/llama-2-70b.json --training profiles/training/pretrain.json \
    -o "$tmp/p100k.json"
  expect 0 "" -- "$ffplan" check "$tmp/p100k.json"
fi

echo "scale: $checks checks, $failures failed"
[ "$failures" -eq 0 ]
