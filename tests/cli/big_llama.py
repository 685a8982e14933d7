"""tests/cli/big_llama.py DIR — a Llama of 36.5 M parameters (hidden 256, 4 layers, 4 heads,
2 key/value heads, vocabulary 65,536: 146 MB in fp32) saved by transformers in DIR/big, with
ffrun plans for it: DIR/one.json (one rank) and DIR/four.json (TP 2 + PP 2 on 4 ranks over two
nodes). Used by tests/cli/test_hf.sh and bench/bench_hf.sh; run with .venv's python."""
import json
import sys

import torch
from transformers import LlamaConfig, LlamaForCausalLM

d = sys.argv[1]
torch.manual_seed(3)
cfg = LlamaConfig(vocab_size=65536, hidden_size=256, intermediate_size=688, num_hidden_layers=4,
                  num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-5,
                  rope_theta=10000.0, max_position_embeddings=64, tie_word_embeddings=False)
LlamaForCausalLM(cfg).save_pretrained(d + "/big", safe_serialization=True)
big = dict(name="big-gqa", hidden=256, ffn_hidden=688, vocab=65536)


def load(path):
    p = json.load(open(path))
    p["inputs"].pop("digests", None)
    p.pop("predicted", None)
    p["inputs"]["model"].update(big)
    return p


p = load("profiles/plans/tiny-gqa-1rank.json")
p["pipelines"][0]["stages"][0]["ranks"][0].update(ffn=[0, 688], vocab=[0, 65536])
json.dump(p, open(d + "/one.json", "w"), indent=1)
p = load("tests/plans/pp2-two-nodes-tp2.json")  # stage 0 on node a (given a second GPU), 1 on b
p["inputs"]["cluster"]["nodes"][0].update(gpus=2, island_gpus=2, island_bandwidth_gb_per_s=5,
                                          island_latency_us=5)
st0, st1 = p["pipelines"][0]["stages"]
st0["ranks"] = [dict(st0["ranks"][0]), dict(st0["ranks"][0], rank=1, gpu=1)]
for i, r in enumerate(st1["ranks"]):
    r["rank"] = 2 + i
for st in (st0, st1):
    for i, r in enumerate(st["ranks"]):
        r.update(heads=[2 * i, 2 * i + 2], kv_heads=[i, i + 1], ffn=[344 * i, 344 * i + 344],
                 vocab=[32768 * i, 32768 * i + 32768])
json.dump(p, open(d + "/four.json", "w"), indent=1)
