#!/usr/bin/env bash
# test_prepare_data.sh FFRUN — scripts/prepare-data with tokenizers trained here, offline: a
# byte-level BPE of 400 tokens on the shipped text makes uint16 files whose documents decode back
# exactly, each between BOS and EOS, split and shuffled by the seed alone; a word-level
# vocabulary of 100,352 tokens makes uint32 files; ffrun trains on both; bad input is refused with
# status 2, naming the file, and writes nothing. Needs .venv (scripts/setup) with `tokenizers`.
set -u
ffrun=$1
py=.venv/bin/python
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
. "$(dirname "$0")/expect.sh"
if ! "$py" -c "import tokenizers" 2>/dev/null; then
  echo "FAIL: $py cannot import tokenizers: run scripts/setup, which installs it into .venv"
  exit 1
fi

# Two tokenizers and a corpus: the LICENSE's paragraphs as JSONL documents, README.md as one.
"$py" - "$tmp" <<'PY'
import json, sys
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
d = sys.argv[1]
tok = Tokenizer(models.BPE())
tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tok.decoder = decoders.ByteLevel()
tok.train(["LICENSE", "README.md"], trainers.BpeTrainer(
    vocab_size=400, special_tokens=["<s>", "</s>"],
    initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
tok.save(d + "/bpe.json")
paras = [p for p in open("LICENSE").read().split("\n\n") if p.strip()]
with open(d + "/docs.jsonl", "w") as f:
    for p in paras:
        f.write(json.dumps({"text": p, "id": len(p)}) + "\n")
words = sorted(set(open("LICENSE").read().split()) | set(open("README.md").read().split()))
V = 100352  # half the corpus words take the first ids, half the last: past 65,535
vocab = {"[UNK]": 0, "<s>": 1, "</s>": 2}
half = len(words) // 2
for i, w in enumerate(words[:half]):
    vocab[w] = 3 + i
for i, w in enumerate(words[half:]):
    vocab[w] = V - 1 - i
for i in range(3 + half, V - (len(words) - half)):
    vocab["filler%d" % i] = i
assert sorted(vocab.values()) == list(range(V))
big = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
big.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
big.save(d + "/big.json")
PY
[ -s "$tmp/bpe.json" ] && [ -s "$tmp/big.json" ] || { echo "FAIL: could not train the test tokenizers"; exit 1; }

prep() { "$py" scripts/prepare-data "$@"; }
expect 0 "vocabulary 400 (uint16 tokens), BOS <s>, EOS </s>, seed 7" \
  prep --tokenizer "$tmp/bpe.json" --out "$tmp/a" --val-fraction 0.1 --seed 7 "$tmp/docs.jsonl" README.md
expect 0 "" prep --tokenizer "$tmp/bpe.json" --out "$tmp/b" --val-fraction 0.1 --seed 7 "$tmp/docs.jsonl" README.md
expect 0 "" prep --tokenizer "$tmp/bpe.json" --out "$tmp/c" --val-fraction 0.1 --seed 8 "$tmp/docs.jsonl" README.md
checks=$((checks + 1))
cmp -s "$tmp/a_train.bin" "$tmp/b_train.bin" && cmp -s "$tmp/a_val.bin" "$tmp/b_val.bin" ||
  fail "the same seed wrote different files"
checks=$((checks + 1))
cmp -s "$tmp/a_train.bin" "$tmp/c_train.bin" && fail "another seed wrote the same training file"
checks=$((checks + 1))
"$py" - "$tmp" <<'PY' || fail "the token files do not hold the documents between BOS and EOS"
import json, struct, sys
from tokenizers import Tokenizer
d = sys.argv[1]
tok = Tokenizer.from_file(d + "/bpe.json")
bos, eos = tok.token_to_id("<s>"), tok.token_to_id("</s>")
def read(path):
    raw = open(path, "rb").read()
    magic, version, n = struct.unpack("<3i", raw[:12])
    assert (magic, version) == (20240520, 1), (path, magic, version)
    assert len(raw) == 1024 + 2 * n, (path, len(raw), n)
    return list(struct.unpack("<%dH" % n, raw[1024:]))
docs = [json.loads(l)["text"] for l in open(d + "/docs.jsonl")] + [open("README.md").read()]
got = []
for part in ("train", "val"):
    ids = read("%s/a_%s.bin" % (d, part))
    assert ids[0] == bos and ids[-1] == eos, (part, ids[:3], ids[-3:])
    doc = []
    for t in ids:
        if t == bos:
            doc = []
        elif t == eos:
            got.append((part, tok.decode(doc)))
        else:
            doc.append(t)
val = [g for p, g in got if p == "val"]
assert len(val) == -(-len(docs) // 10), (len(val), len(docs))  # ceil(0.1 · documents)
assert sorted(g for _, g in got) == sorted(docs), "decoded documents differ from the corpus"
PY

# ffrun trains on them: a model of the tokenizer's vocabulary; and on uint32 tokens past 65,535.
python3 - "$tmp" <<'PY'
import json, sys
d = sys.argv[1]
for name, vocab in (("v400", 400), ("v100352", 100352)):
    p = json.load(open("profiles/plans/tiny-1rank.json"))
    p["inputs"].pop("digests", None)
    p.pop("predicted", None)
    p["inputs"]["model"]["vocab"] = vocab
    p["pipelines"][0]["stages"][0]["ranks"][0]["vocab"] = [0, vocab]
    json.dump(p, open("%s/%s.json" % (d, name), "w"), indent=1)
PY
expect 0 "" "$ffrun" "$tmp/v400.json" --data "$tmp/a_train.bin" --steps 3 --quiet --metrics "$tmp/m400.jsonl"
expect 0 "vocabulary 100352 (uint32 tokens), BOS <s>, EOS </s>" \
  prep --tokenizer "$tmp/big.json" --out "$tmp/w" --val-fraction 0 "$tmp/docs.jsonl" README.md
checks=$((checks + 1))
[ ! -e "$tmp/w_val.bin" ] || fail "--val-fraction 0 wrote a validation file"
checks=$((checks + 1))
python3 - "$tmp/w_train.bin" <<'PY' || fail "the 100,352-token vocabulary's file is not uint32 with ids past 65,535"
import struct, sys
raw = open(sys.argv[1], "rb").read()
magic, version, n = struct.unpack("<3i", raw[:12])
assert (magic, version) == (20240801, 7) and len(raw) == 1024 + 4 * n, (magic, version, n)
ids = struct.unpack("<%dI" % n, raw[1024:])
assert max(ids) > 65535 and max(ids) < 100352 and 0 not in ids, (max(ids), 0 in ids)
PY
expect 0 "" "$ffrun" "$tmp/v100352.json" --data "$tmp/w_train.bin" --steps 2 --quiet
expect 2 "holds uint16 tokens" "$ffrun" "$tmp/v100352.json" --data "$tmp/a_train.bin" --quiet

# Bad input: status 2, the file named, nothing written.
printf '{"text": "one"}\n{"text": 2}\n' >"$tmp/bad.jsonl"
printf '{"text": "one"}\nnot json\n' >"$tmp/notjson.jsonl"
expect 2 "bad.jsonl:2: expected an object with a string \"text\"" \
  prep --tokenizer "$tmp/bpe.json" --out "$tmp/x" "$tmp/bad.jsonl"
expect 2 "notjson.jsonl:2: not JSON" prep --tokenizer "$tmp/bpe.json" --out "$tmp/x" "$tmp/notjson.jsonl"
expect 2 "missing.txt: cannot read" prep --tokenizer "$tmp/bpe.json" --out "$tmp/x" "$tmp/missing.txt"
expect 2 "bpe.json: the tokenizer has no token '<bos>'" \
  prep --tokenizer "$tmp/bpe.json" --bos "<bos>" --out "$tmp/x" README.md
expect 2 "LICENSE: not a tokenizer.json" prep --tokenizer LICENSE --out "$tmp/x" README.md
expect 2 "--val-fraction" prep --tokenizer "$tmp/bpe.json" --val-fraction 1.5 --out "$tmp/x" README.md
checks=$((checks + 1))
[ -z "$(ls "$tmp" | grep '^x')" ] || fail "a refused run left files: $(ls "$tmp" | grep '^x' | tr '\n' ' ')"

echo "prepare-data: $checks checks, $failures failed"
[ "$failures" -eq 0 ]
