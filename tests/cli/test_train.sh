#!/usr/bin/env bash
# test_train.sh FFRUN — one-rank training as a specification: the loss of the tiny model falls on
# the shipped text; 10 steps straight equal 5 steps + --resume + 5 steps, bit for bit (losses and
# the final checkpoint); bad data and mismatched checkpoints are refused with status 2, a clear
# message, and nothing overwritten.
set -u
ffrun=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
. "$(dirname "$0")/expect.sh"
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
expect 0 "" "$ffrun" "$plan" --data "$tmp/good.bin" --steps 2 --quiet --metrics "$tmp/u16.jsonl"
# uint32 tokens (llm.c's Llama-3 files: magic 20240801, version 7): the same ids train the same
# losses; a vocabulary past uint16 trains from them, one rank and over a TP pair whose second
# vocabulary shard holds only ids past 65,535, alike; uint16 files are refused for it.
python3 - "$tmp" profiles/plans/tiny-gqa-1rank.json tests/plans/tp2-heads-3to1.json <<'PY'
import json, struct, sys
d, one, tp2 = sys.argv[1:]
def tokens(path, ids, wide=True, cut=0):
    magic, version, fmt = (20240801, 7, "I") if wide else (20240520, 1, "H")
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", magic, version, len(ids), *([0] * 253)))
        f.write(struct.pack("<%d%s" % (len(ids), fmt), *ids)[:-cut or None])
tokens(d + "/good32.bin", [i % 256 for i in range(1000)])
tokens(d + "/cut32.bin", [i % 256 for i in range(1000)], cut=2)
V = 100352  # past uint16, as Llama-3's 128,256 is
big = [(i * 7919) % V if i % 3 else 65536 + (i * 104729) % (V - 65536) for i in range(4000)]
tokens(d + "/big32.bin", big)
tokens(d + "/big16.bin", [t % 65536 for t in big], wide=False)
tokens(d + "/over32.bin", big[:100] + [V] + big[100:])
for src, dst, split in ((one, "big-1rank.json", None), (tp2, "big-tp2.json", 70000)):
    p = json.load(open(src))
    p["inputs"].pop("digests", None)
    p["inputs"]["model"]["vocab"] = V
    for pl in p["pipelines"]:
        for st in pl["stages"]:
            for i, r in enumerate(st["ranks"]):
                if len(st["ranks"]) == 1:
                    r["vocab"] = [0, V]
                else:
                    r["vocab"] = [0, split] if i == 0 else [split, V]
    p.pop("predicted", None)
    json.dump(p, open(d + "/" + dst, "w"), indent=1)
PY
expect 0 "" "$ffrun" "$plan" --data "$tmp/good32.bin" --steps 2 --quiet --metrics "$tmp/u32.jsonl"
checks=$((checks + 1))
diff <(sed 's/"step_seconds.*//' "$tmp/u16.jsonl") <(sed 's/"step_seconds.*//' "$tmp/u32.jsonl") >/dev/null ||
  fail "the same ids in uint32 tokens trained other losses than in uint16"
expect 2 "header says 1000 tokens of 4 bytes but the file holds 3998 bytes of tokens (not a whole number of tokens)" \
  "$ffrun" "$plan" --data "$tmp/cut32.bin" --quiet
expect 2 "holds uint16 tokens (magic 20240520), which cannot name the model's vocab of 100352" \
  "$ffrun" "$tmp/big-1rank.json" --data "$tmp/big16.bin" --quiet
expect 2 "token 100352 at position 100 is not below the model's vocab 100352" \
  "$ffrun" "$tmp/big-1rank.json" --data "$tmp/over32.bin" --quiet
expect 0 "" "$ffrun" "$tmp/big-1rank.json" --data "$tmp/big32.bin" --steps 2 --quiet --metrics "$tmp/big1.jsonl"
if command -v mpirun >/dev/null; then
  # (LeakSanitizer cannot follow Open MPI's threads)
  expect 0 "" env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
    ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0" timeout 300 mpirun -np 2 \
    --oversubscribe "$ffrun" "$tmp/big-tp2.json" --data "$tmp/big32.bin" --steps 2 --quiet \
    --metrics "$tmp/big2.jsonl"
  checks=$((checks + 1))
  python3 - "$tmp/big1.jsonl" "$tmp/big2.jsonl" <<'PY' || fail "a TP pair over a 100,352-token vocabulary trained other losses than one rank"
import json, math, sys
a, b = ([json.loads(l)["loss"] for l in open(f)] for f in sys.argv[1:])
assert len(a) == len(b) == 2, (a, b)
for x, y in zip(a, b):
    assert abs(x - y) <= 1e-5 * abs(x), (x, y)
# untrained, the loss is about log V: the big ids reached the head
assert abs(a[0] - math.log(100352)) < 1.0, a[0]
PY
fi
cp -r "$tmp/a" "$tmp/a-before"
expect 2 "this checkpoint is of model \"tiny\"" "$ffrun" profiles/plans/tiny-gqa-1rank.json --text LICENSE --quiet --checkpoint-dir "$tmp/a" --resume
expect 2 "" "$ffrun" profiles/plans/tiny-1rank.json --text LICENSE --quiet --checkpoint-every 2
checks=$((checks + 1))
diff -r "$tmp/a" "$tmp/a-before" >/dev/null || fail "a refused run changed the checkpoint directory"
expect 2 "needs --data FILE or --text FILE" "$ffrun" "$plan"
# Validation data is checked as training data is; its options need it.
expect 2 "--eval-every and --eval-batches need --eval-data FILE" "$ffrun" "$plan" --text LICENSE --eval-every 2
expect 2 "nowhere.bin: cannot open" "$ffrun" "$plan" --text LICENSE --eval-data "$tmp/nowhere.bin" --quiet
expect 2 "holds uint16 tokens (magic 20240520), which cannot name the model's vocab of 100352" \
  "$ffrun" "$tmp/big-1rank.json" --data "$tmp/big32.bin" --eval-data "$tmp/big16.bin" --quiet
expect 2 "expects a positive integer" "$ffrun" "$plan" --text LICENSE --eval-data LICENSE --eval-batches 0
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
