#!/usr/bin/env bash
# test_hf.sh FFRUN FFPLAN — Hugging Face checkpoints in and out, against transformers, offline.
# `ffrun --init-from DIR`: tiny Llamas
# made with transformers (random weights, GQA untied, multi-head tied), saved with
# save_pretrained (fp32 in one file; bf16 in shards with an index), trained one step by ffrun
# under a TP 3:1 + PP 2 plan (tied: TP 3:1, since tied embeddings share one stage) and on one
# rank: the first step's loss equals transformers' on the same batch within 1e-4 relative.
# Bad directories are refused with status 2, naming the file: a config that differs from the
# plan, a missing shard, an unknown dtype, a truncated file, an oversized header.
# `ffrun export`: 3 steps trained under TP 3:1 + PP 2 (and the tied model under TP 3:1), exported
# in fp32 (one file) and bf16 (shards): transformers loads each, and its weights equal the
# checkpoint's exactly (bf16: rounded to nearest even, as torch rounds); the export trains on
# from --init-from with transformers' loss, and the validation loss ffrun reported after step 3
# (--eval-data) is transformers' on the same sequences. Bad exports exit 2 and leave an earlier
# one intact.
# Sharded loading: under TP 2 + PP 2, each rank's peak resident set with --init-from of a 146 MB
# model exceeds its peak without (random initial weights) by less than half the model.
# Needs .venv (scripts/setup) with transformers.
set -u
ffrun=$1 ffplan=$2
py=.venv/bin/python
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
. "$(dirname "$0")/expect.sh"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export HF_HUB_OFFLINE=1 HF_HUB_DISABLE_PROGRESS_BARS=1 TRANSFORMERS_VERBOSITY=error
# LeakSanitizer cannot follow Open MPI's threads.
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
if ! "$py" -c "import transformers" 2>/dev/null; then
  echo "FAIL: $py cannot import transformers: run scripts/setup, which installs it into .venv"
  exit 1
fi

# The models, their directories, ffrun's plans for them, and transformers' loss of step 1's
# batch (global batch 8 of 64 tokens from LICENSE's bytes, as ffrun --text reads them).
"$py" - "$tmp" <<'PY' || { echo "FAIL: could not make the test models"; exit 1; }
import json, sys, torch
from transformers import LlamaConfig, LlamaForCausalLM
d = sys.argv[1]
S, B = 64, 8
data = list(open("LICENSE", "rb").read())
batch = [data[(j * S) % (len(data) - S):][: S + 1] for j in range(B)]
x = torch.tensor([b[:S] for b in batch])
y = torch.tensor([b[1:] for b in batch])

def make(name, kv, tied, seed):
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=172, num_hidden_layers=4,
                      num_attention_heads=4, num_key_value_heads=kv, rms_norm_eps=1e-5,
                      rope_theta=10000.0, max_position_embeddings=S, tie_word_embeddings=tied)
    m = LlamaForCausalLM(cfg)
    with torch.no_grad():  # weights large enough that every one shows in the loss
        for n, p in m.named_parameters():
            p.copy_(torch.empty_like(p).uniform_(0.5, 1.5) if "norm" in n else torch.randn_like(p) * 0.15)
    m.save_pretrained(d + "/" + name, safe_serialization=True)
    m.to(torch.bfloat16).save_pretrained(d + "/" + name + "-bf16", safe_serialization=True,
                                         max_shard_size="60KB")
    losses = {}
    for which in (name, name + "-bf16"):
        r = LlamaForCausalLM.from_pretrained(d + "/" + which, torch_dtype=torch.float32).eval()
        with torch.no_grad():
            logits = r(x).logits
        losses[which] = torch.nn.functional.cross_entropy(logits.reshape(-1, 256), y.reshape(-1)).item()
    return losses

losses = make("gqa", 2, False, 1)
losses.update(make("tied", 4, True, 2))
json.dump(losses, open(d + "/losses.json", "w"))

def plan(src, dst, mutate):
    p = json.load(open(src))
    p["inputs"].pop("digests", None)
    p.pop("predicted", None)
    mutate(p)
    json.dump(p, open(d + "/" + dst, "w"), indent=1)

def pp2_tp31(p):  # stage 0: ranks 0, 1 on node a (TP 3:1); stage 1: ranks 2, 3 on node b
    a = p["inputs"]["cluster"]["nodes"][0]  # node a: one GPU in the file, two here
    a.update(gpus=2, island_gpus=2, island_bandwidth_gb_per_s=5, island_latency_us=5)
    st0, st1 = p["pipelines"][0]["stages"]
    r0 = st0["ranks"][0]
    r1 = dict(r0, rank=1, gpu=1, heads=[3, 4], kv_heads=[1, 2], ffn=[120, 172], vocab=[200, 256])
    st0["ranks"] = [dict(r0, heads=[0, 3], kv_heads=[0, 2], ffn=[0, 120], vocab=[0, 200]), r1]
    for i, r in enumerate(st1["ranks"]):
        r["rank"] = 2 + i
plan("tests/plans/pp2-two-nodes-tp2.json", "gqa-pp2-tp31.json", pp2_tp31)
plan("profiles/plans/tiny-gqa-1rank.json", "gqa-1rank.json", lambda p: None)

def tied_tp31(p):
    p["inputs"]["model"].update(name="tiny-tied", kv_heads=4, tied_embeddings=True)
    for st in p["pipelines"][0]["stages"]:
        st["ranks"][0]["kv_heads"], st["ranks"][1]["kv_heads"] = [0, 3], [3, 4]
plan("tests/plans/tp2-heads-3to1.json", "tied-tp31.json", tied_tp31)
PY

loss_of() { sed -n '1s/.*"loss": \([0-9.e+-]*\).*/\1/p' "$1"; }
compare() { # metrics-file losses-key what
  checks=$((checks + 1))
  local got want
  got=$(loss_of "$1")
  want=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])" "$tmp/losses.json" "$2")
  awk -v a="$got" -v b="$want" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(a != "" && d <= 1e-4 * b) }' ||
    fail "$3: ffrun's first loss $got, transformers' $want"
  echo "$3: ffrun $got, transformers $want"
}
run() { # ranks plan dir metrics
  local n=$1
  shift
  if [ "$n" = 1 ]; then
    expect 0 "" "$ffrun" "$tmp/$1" --text LICENSE --init-from "$tmp/$2" --steps 1 --quiet --metrics "$tmp/$3"
  else
    expect 0 "" timeout 300 mpirun -np "$n" --oversubscribe "$ffrun" "$tmp/$1" --text LICENSE \
      --init-from "$tmp/$2" --steps 1 --quiet --metrics "$tmp/$3"
  fi
}
run 4 gqa-pp2-tp31.json gqa m1.jsonl
compare "$tmp/m1.jsonl" gqa "GQA, fp32, TP 3:1 + PP 2"
run 1 gqa-1rank.json gqa m2.jsonl
compare "$tmp/m2.jsonl" gqa "GQA, fp32, one rank"
checks=$((checks + 1))
ls "$tmp/gqa-bf16" | grep -q "model.safetensors.index.json" || fail "the bf16 copy was not saved in shards"
run 4 gqa-pp2-tp31.json gqa-bf16 m3.jsonl
compare "$tmp/m3.jsonl" gqa-bf16 "GQA, bf16 shards, TP 3:1 + PP 2"
run 2 tied-tp31.json tied m4.jsonl
compare "$tmp/m4.jsonl" tied "tied, fp32, TP 3:1"
run 2 tied-tp31.json tied-bf16 m5.jsonl
compare "$tmp/m5.jsonl" tied-bf16 "tied, bf16 shards, TP 3:1"

# scripts/hf-model: config.json to the plan's model (the test plans' "tiny-gqa" but for its name).
expect 0 "" scripts/hf-model "$tmp/gqa/config.json" --seq-len 64 -o "$tmp/gqa-model.json"
expect 0 "" "$ffplan" validate "$tmp/gqa-model.json"
checks=$((checks + 1))
python3 - "$tmp/gqa-model.json" "$tmp/gqa-1rank.json" <<'PY' || fail "scripts/hf-model wrote another model"
import json, sys
got, want = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))["inputs"]["model"]
keys = ("layers hidden heads kv_heads ffn_hidden vocab seq_len norm norm_eps activation "
        "rope_theta tied_embeddings").split()
diff = [k for k in keys if got.get(k) != want.get(k)]
assert not diff and got["format"] == "ff-model/1" and got["name"] == "gqa", (diff, got)
PY
cp -r "$tmp/gqa" "$tmp/scaled"
python3 -c "import json,sys; p=sys.argv[1]; c=json.load(open(p)); c['rope_scaling']={'rope_type': 'llama3', 'factor': 8.0}; json.dump(c, open(p, 'w'))" "$tmp/scaled/config.json"
expect 2 "config.json: rope_scaling: is set" scripts/hf-model "$tmp/scaled/config.json" -o "$tmp/x.json"
expect 2 "rope_scaling" "$ffrun" "$tmp/gqa-1rank.json" --text LICENSE --init-from "$tmp/scaled" --quiet
expect 2 "nowhere/config.json: cannot open" scripts/hf-model "$tmp/nowhere/config.json" -o "$tmp/x.json"
checks=$((checks + 1))
[ ! -e "$tmp/x.json" ] || fail "a refused scripts/hf-model wrote its output"

# Bad directories: status 2, the file and what is wrong named.
cp -r "$tmp/gqa" "$tmp/wide"
sed -i 's/"hidden_size": 64/"hidden_size": 128/' "$tmp/wide/config.json"
expect 2 "wide/config.json: hidden_size: is 128, but the plan's model has hidden 64" \
  "$ffrun" "$tmp/gqa-1rank.json" --text LICENSE --init-from "$tmp/wide" --quiet
expect 2 "tie_word_embeddings" "$ffrun" "$tmp/gqa-1rank.json" --text LICENSE --init-from "$tmp/tied" --quiet
cp -r "$tmp/gqa-bf16" "$tmp/noshard"
shard=$(ls "$tmp/noshard" | grep -m1 '^model-0000[2-9]')
rm "$tmp/noshard/$shard"
expect 2 "$shard: cannot open" "$ffrun" "$tmp/gqa-1rank.json" --text LICENSE --init-from "$tmp/noshard" --quiet
cp -r "$tmp/gqa" "$tmp/i32"
python3 - "$tmp/i32/model.safetensors" <<'PY'
import sys
p = sys.argv[1]
b = bytearray(open(p, "rb").read())
n = int.from_bytes(b[:8], "little")
head = b[8:8 + n].replace(b'"F32"', b'"I32"', 1)
open(p, "wb").write(bytes(b[:8]) + head + bytes(b[8 + n:]))
PY
expect 2 'dtype "I32" is not one of F32, BF16, F16' \
  "$ffrun" "$tmp/gqa-1rank.json" --text LICENSE --init-from "$tmp/i32" --quiet
cp -r "$tmp/gqa" "$tmp/cut"
truncate -s -4096 "$tmp/cut/model.safetensors"
expect 2 "(truncated?)" "$ffrun" "$tmp/gqa-1rank.json" --text LICENSE --init-from "$tmp/cut" --quiet
cp -r "$tmp/gqa" "$tmp/huge"
python3 -c "import sys; open(sys.argv[1], 'r+b').write((1 << 40).to_bytes(8, 'little'))" "$tmp/huge/model.safetensors"
expect 2 "its header length is over 100 MiB" \
  "$ffrun" "$tmp/gqa-1rank.json" --text LICENSE --init-from "$tmp/huge" --quiet
expect 2 "config.json: cannot open" "$ffrun" "$tmp/gqa-1rank.json" --text LICENSE --init-from "$tmp/nowhere" --quiet

# ---- export ---------------------------------------------------------------------------------
expect 0 "" timeout 300 mpirun -np 4 --oversubscribe "$ffrun" "$tmp/gqa-pp2-tp31.json" --text LICENSE \
  --init-from "$tmp/gqa" --steps 3 --quiet --checkpoint-dir "$tmp/ck" --eval-data README.md \
  --eval-batches 2 --metrics "$tmp/m-ck.jsonl"
expect 0 "" timeout 300 mpirun -np 2 --oversubscribe "$ffrun" "$tmp/tied-tp31.json" --text LICENSE \
  --init-from "$tmp/tied" --steps 3 --quiet --checkpoint-dir "$tmp/ck-tied"
expect 0 "" "$ffrun" export "$tmp/ck" -o "$tmp/e32" --quiet
expect 0 "" "$ffrun" export "$tmp/ck/step-00000003.safetensors" -o "$tmp/e16" --dtype bf16 \
  --max-shard-size 60KB --quiet
expect 0 "" "$ffrun" export "$tmp/ck-tied" -o "$tmp/e-tied" --quiet
checks=$((checks + 1))
[ -f "$tmp/e16/model.safetensors.index.json" ] && [ ! -f "$tmp/e16/model.safetensors" ] &&
  [ -f "$tmp/e32/model.safetensors" ] || fail "export: expected one file in fp32 and shards in bf16"
checks=$((checks + 1))
"$py" - "$tmp" <<'PY' || fail "export: transformers' weights differ from the checkpoint's"
import json, sys, torch
from safetensors.torch import load_file
from transformers import LlamaForCausalLM
d = sys.argv[1]
names = {"attn_norm": "input_layernorm", "wq": "self_attn.q_proj", "wk": "self_attn.k_proj",
         "wv": "self_attn.v_proj", "wo": "self_attn.o_proj", "mlp_norm": "post_attention_layernorm",
         "w_gate": "mlp.gate_proj", "w_up": "mlp.up_proj", "w_down": "mlp.down_proj"}
def check(export, ckpt, dtype, D=16):
    ck = load_file(ckpt)
    sd = LlamaForCausalLM.from_pretrained(export, torch_dtype=dtype).state_dict()
    seen = 0
    for k, w in ck.items():
        if k.startswith("adam_"):
            continue
        if k in ("embed", "final_norm", "lm_head"):
            h = {"embed": "model.embed_tokens", "final_norm": "model.norm", "lm_head": "lm_head"}[k]
        else:
            _, layer, t = k.split(".")
            h = "model.layers.%s.%s" % (layer, names[t])
            if t in ("wq", "wk"):  # ffrun's row 2i + p of a head is Hugging Face's row p*D/2 + i
                w = w.reshape(-1, D // 2, 2, w.shape[1]).transpose(1, 2).reshape(w.shape)
        seen += 1
        if not torch.equal(sd[h + ".weight"], w.to(dtype)):
            sys.exit("%s: %s differs from the checkpoint's %s" % (export, h, k))
    if "lm_head" not in ck and not torch.equal(sd["lm_head.weight"], sd["model.embed_tokens.weight"]):
        sys.exit("%s: the tied lm_head is not the embedding" % export)
    print("%s: %d tensors equal the checkpoint's" % (export, seen))
check(d + "/e32", d + "/ck/step-00000003.safetensors", torch.float32)
check(d + "/e16", d + "/ck/step-00000003.safetensors", torch.bfloat16)
check(d + "/e-tied", d + "/ck-tied/step-00000003.safetensors", torch.float32)
# transformers' loss of the exported model on step 1's batch, for the run below
S, B = 64, 8
data = list(open("LICENSE", "rb").read())
batch = [data[(j * S) % (len(data) - S):][: S + 1] for j in range(B)]
x, y = torch.tensor([b[:S] for b in batch]), torch.tensor([b[1:] for b in batch])
m = LlamaForCausalLM.from_pretrained(d + "/e32", torch_dtype=torch.float32).eval()
with torch.no_grad():
    loss = torch.nn.functional.cross_entropy(m(x).logits.reshape(-1, 256), y.reshape(-1)).item()
losses = json.load(open(d + "/losses.json"))
losses["e32"] = loss
# and its validation loss: 2 global batches of README.md's bytes, sequence j of batch t at
# ((t * 8 + j) * 64) mod (n - 64), as ffrun --eval-data reads them
val = list(open("README.md", "rb").read())
seqs = [val[((t * B + j) * S) % (len(val) - S):][: S + 1] for t in range(2) for j in range(B)]
vx, vy = torch.tensor([q[:S] for q in seqs]), torch.tensor([q[1:] for q in seqs])
with torch.no_grad():
    losses["val_e32"] = torch.nn.functional.cross_entropy(m(vx).logits.reshape(-1, 256), vy.reshape(-1)).item()
json.dump(losses, open(d + "/losses.json", "w"))
PY
checks=$((checks + 1))
got=$(sed -n 's/.*"val_loss": \([0-9.e+-]*\).*/\1/p' "$tmp/m-ck.jsonl" | tail -1)
want=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['val_e32'])" "$tmp/losses.json")
awk -v a="$got" -v b="$want" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(a != "" && d <= 1e-4 * b) }' ||
  fail "validation after step 3 under TP 3:1 + PP 2: ffrun $got, transformers $want"
echo "validation loss after step 3, TP 3:1 + PP 2: ffrun $got, transformers $want"
# An export over another replaces it whole: the bf16 shards and their index give way to one file.
cp -r "$tmp/e16" "$tmp/e-over"
expect 0 "" "$ffrun" export "$tmp/ck" -o "$tmp/e-over" --quiet
checks=$((checks + 1))
[ "$(ls -A "$tmp/e-over" | tr '\n' ' ')" = "config.json model.safetensors " ] &&
  cmp -s "$tmp/e-over/model.safetensors" "$tmp/e32/model.safetensors" ||
  fail "an export over a sharded one left: $(ls -A "$tmp/e-over" | tr '\n' ' ')"
run 1 gqa-1rank.json e32 m6.jsonl
compare "$tmp/m6.jsonl" e32 "export, then --init-from, one rank"

# Bad exports: status 2, the file named, an earlier export left as it was.
cp "$tmp/e32/model.safetensors" "$tmp/before.safetensors"
mkdir "$tmp/ck-bad"
cp "$tmp/ck/step-00000003.safetensors" "$tmp/ck-bad/"
python3 -c "import sys; f = open(sys.argv[1], 'r+b'); f.seek(-100, 2); b = f.read(1); f.seek(-100, 2); f.write(bytes([b[0] ^ 1]))" \
  "$tmp/ck-bad/step-00000003.safetensors"
expect 2 "checksum mismatch" "$ffrun" export "$tmp/ck-bad" -o "$tmp/e32" --quiet
checks=$((checks + 1))
cmp -s "$tmp/before.safetensors" "$tmp/e32/model.safetensors" && [ -z "$(ls -A "$tmp/e32" | grep -v -e config.json -e model.safetensors)" ] ||
  fail "a failed export changed the earlier one"
expect 2 "holds no checkpoint" "$ffrun" export "$tmp/gqa" -o "$tmp/e-none"
expect 2 "nowhere: cannot open" "$ffrun" export "$tmp/nowhere" -o "$tmp/e-none"
expect 2 'dtype "fp16" is not one of: fp32, bf16' "$ffrun" export "$tmp/ck" -o "$tmp/e-none" --dtype fp16
expect 2 "-o DIR is required" "$ffrun" export "$tmp/ck"
expect 2 "expected a size" "$ffrun" export "$tmp/ck" -o "$tmp/e-none" --max-shard-size 5XB
checks=$((checks + 1))
[ ! -e "$tmp/e-none" ] || fail "a refused export created its directory"
# A checkpoint without its model's JSON (as an older ffrun wrote them) needs --plan, of its model.
python3 - "$tmp/ck/step-00000003.safetensors" "$tmp/old.safetensors" <<'PY'
import json, sys
b = open(sys.argv[1], "rb").read()
n = int.from_bytes(b[:8], "little")
h = json.loads(b[8:8 + n])
del h["__metadata__"]["model_json"]
t = json.dumps(h, separators=(",", ":")).encode()
t += b" " * (-len(t) % 8)
open(sys.argv[2], "wb").write(len(t).to_bytes(8, "little") + t + b[8 + n:])
PY
expect 2 "model_json: is missing" "$ffrun" export "$tmp/old.safetensors" -o "$tmp/e-old"
expect 2 "describes a model of digest" "$ffrun" export "$tmp/old.safetensors" -o "$tmp/e-old" \
  --plan "$tmp/tied-tp31.json"
expect 0 "" "$ffrun" export "$tmp/old.safetensors" -o "$tmp/e-old" --plan "$tmp/gqa-1rank.json" --quiet
checks=$((checks + 1))
cmp -s "$tmp/e-old/model.safetensors" "$tmp/e32/model.safetensors" || fail "export with --plan differs"

# ---- loading is sharded: a 146 MB model (fp32, one file) under TP 2 + PP 2 ------------------
"$py" tests/cli/big_llama.py "$tmp" || fail "could not make the 146 MB model"
for mode in random init; do
  extra=()
  [ "$mode" = init ] && extra=(--init-from "$tmp/big")
  expect 0 "" timeout 300 mpirun -np 4 --oversubscribe sh -c '/usr/bin/time -f %M -o "$0.$OMPI_COMM_WORLD_RANK" "$@"' \
    "$tmp/rss.$mode" "$ffrun" "$tmp/four.json" --text LICENSE --steps 1 --quiet "${extra[@]}"
done
model_kb=$(( $(stat -c %s "$tmp/big/model.safetensors") / 1024 ))
for r in 0 1 2 3; do
  checks=$((checks + 1))
  a=$(tail -1 "$tmp/rss.random.$r") b=$(tail -1 "$tmp/rss.init.$r")
  echo "rank $r: peak resident $a KiB with random weights, $b KiB with --init-from of a $model_kb KiB model"
  [ -n "$a" ] && [ -n "$b" ] && [ $((b - a)) -lt $((model_kb / 2)) ] ||
    fail "rank $r: --init-from added $((b - a)) KiB to the peak resident set, half the model is $((model_kb / 2)) KiB"
done

echo "hugging-face: $checks checks, $failures failed"
[ "$failures" -eq 0 ]
