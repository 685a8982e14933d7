#!/usr/bin/env bash
# test_train.sh FFRUN — one-rank training as a specification: the loss of the tiny model falls on
# the shipped text; 10 steps straight equal 5 steps + --resume + 5 steps, bit for bit (losses and
# the final checkpoint); bad data and mismatched checkpoints are refused with status 2, a clear
# message, and nothing overwritten.
set -u
ffrun=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failures=0
checks=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
expect() { # status message-substring command...
  local want=$1 msg=$2
  shift 2
  checks=$((checks + 1))
  "$@" >"$tmp/out" 2>"$tmp/err"
  local got=$?
  [ "$got" = "$want" ] || { fail "$*: status $got, expected $want"; sed 's/^/  | /' "$tmp/err" | tail -5; return; }
  [ -z "$msg" ] || grep -qF -- "$msg" "$tmp/err" || { fail "$*: no '$msg' in:"; sed 's/^/  | /' "$tmp/err" | tail -5; }
}
plan=profiles/plans/tiny-1rank.json

# The loss falls.
expect 0 "" "$ffrun" "$plan" --text LICENSE --steps 20 --quiet --metrics "$tmp/m.jsonl"
first=$(head -1 "$tmp/m.jsonl" | sed 's/.*"loss": \([0-9.e+-]*\).*/\1/')
last=$(tail -1 "$tmp/m.jsonl" | sed 's/.*"loss": \([0-9.e+-]*\).*/\1/')
checks=$((checks + 1))
awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a - 0.5) }' || fail "loss did not fall: $first -> $last"
checks=$((checks + 1))
[ "$(wc -l <"$tmp/m.jsonl")" = 20 ] || fail "expected 20 metrics lines"
for key in step loss lr grad_norm tokens_per_second flops_per_second mfu compute_seconds peak_memory_gib predicted; do
  checks=$((checks + 1))
  grep -q "\"$key\"" "$tmp/m.jsonl" || fail "metrics lack $key"
done

# Resume is bitwise: 10 straight == 5 + resume + 5.
expect 0 "" "$ffrun" "$plan" --text LICENSE --steps 10 --quiet --metrics "$tmp/a.jsonl" --checkpoint-dir "$tmp/a"
expect 0 "" "$ffrun" "$plan" --text LICENSE --steps 5 --quiet --metrics "$tmp/b.jsonl" --checkpoint-dir "$tmp/b"
expect 0 "" "$ffrun" "$plan" --text LICENSE --steps 10 --quiet --metrics "$tmp/b.jsonl" --checkpoint-dir "$tmp/b" --resume
checks=$((checks + 1))
diff <(sed 's/"step_seconds.*//' "$tmp/a.jsonl") <(sed 's/"step_seconds.*//' "$tmp/b.jsonl") >/dev/null ||
  fail "losses after resume differ from the straight run"
checks=$((checks + 1))
cmp -s "$tmp/a/step-00000010.safetensors" "$tmp/b/step-00000010.safetensors" ||
  fail "final checkpoints differ after resume"

# Bad inputs: a clear message, status 2, nothing overwritten.
printf 'too short' >"$tmp/short.txt"
expect 2 "too short for one sequence" "$ffrun" "$plan" --text "$tmp/short.txt" --quiet
python3 - "$tmp" <<'PY'
import struct, sys
d = sys.argv[1]
def tokens(path, magic, ids):
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", magic, 1, len(ids), *([0] * 253)))
        f.write(struct.pack("<%dH" % len(ids), *ids))
tokens(d + "/magic.bin", 12345, list(range(100)))
tokens(d + "/big-id.bin", 20240520, [1] * 80 + [300] + [2] * 80)
tokens(d + "/good.bin", 20240520, [i % 256 for i in range(1000)])
PY
expect 2 "not an llm.c token file" "$ffrun" "$plan" --data "$tmp/magic.bin" --quiet
expect 2 "token 300 at position 80 is not below the model's vocab 256" "$ffrun" "$plan" --data "$tmp/big-id.bin" --quiet
expect 0 "" "$ffrun" "$plan" --data "$tmp/good.bin" --steps 2 --quiet
cp -r "$tmp/a" "$tmp/a-before"
expect 2 "this checkpoint is of model \"tiny\"" "$ffrun" profiles/plans/tiny-gqa-1rank.json --text LICENSE --quiet --checkpoint-dir "$tmp/a" --resume
expect 2 "" "$ffrun" profiles/plans/tiny-1rank.json --text LICENSE --quiet --checkpoint-every 2
checks=$((checks + 1))
diff -r "$tmp/a" "$tmp/a-before" >/dev/null || fail "a refused run changed the checkpoint directory"
expect 2 "needs --data FILE or --text FILE" "$ffrun" "$plan"
# A ZeRO-1 plan counts on sharded optimizer state, which ffrun does not shard: refused up front.
python3 - "$plan" "$tmp/zero1.json" <<'PY'
import json, sys
p = json.load(open(sys.argv[1]))
p["inputs"].pop("digests", None)
p["inputs"]["training"]["zero1"] = True
json.dump(p, open(sys.argv[2], "w"), indent=2)
PY
expect 2 "zero1.json: inputs.training.zero1: is true, but ffrun keeps the whole optimizer state" \
  "$ffrun" "$tmp/zero1.json" --text LICENSE --quiet
# attention "megatron" describes another framework's kernels for ffplan simulate: refused.
python3 - "$plan" "$tmp/megatron.json" <<'PY'
import json, sys
p = json.load(open(sys.argv[1]))
p["inputs"].pop("digests", None)
p["inputs"]["training"]["attention"] = "megatron"
json.dump(p, open(sys.argv[2], "w"), indent=2)
PY
expect 2 "megatron.json: inputs.training.attention: is \"megatron\"" \
  "$ffrun" "$tmp/megatron.json" --text LICENSE --quiet
# wire "bf16" describes frameworks that send bf16 activations, for ffplan simulate: refused.
python3 - "$plan" "$tmp/wire.json" <<'PY'
import json, sys
p = json.load(open(sys.argv[1]))
p["inputs"].pop("digests", None)
p["inputs"]["training"]["precision"] = "bf16"
p["inputs"]["training"]["wire"] = "bf16"
json.dump(p, open(sys.argv[2], "w"), indent=2)
PY
expect 2 "wire.json: inputs.training.wire: is \"bf16\"" \
  "$ffrun" "$tmp/wire.json" --text LICENSE --quiet
expect 2 "expects a positive integer" "$ffrun" "$plan" --text LICENSE --steps zero

echo "train: $checks checks, $failures failed"
[ "$failures" -eq 0 ]
