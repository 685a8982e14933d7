#!/usr/bin/python3
"""bench/torch_step.py — PyTorch's training step for bench_train's model, as a peer to ffrun.

  bench/torch_step.py [--threads N] [--steps N]

The same Llama as bench/bench_train.c: hidden 512, 8 heads, FFN 1376, 8 layers, sequence 256,
byte vocabulary 256, untied head, RMSNorm, interleaved-pair RoPE, SwiGLU; a global batch of 8
sequences of LICENSE's bytes in micro-batches of 4; float32; torch.optim.AdamW (lr 1e-3, betas
0.9/0.95, weight decay 0.1), eager attention (PyTorch 1.13 has no fused attention on the CPU).
Prints one line, `torch_step_ms <median of the timed steps> <torch version> <threads>`, after
one warm-up step. The threads are OpenBLAS's, which Debian's torch does its matmuls in, as
bench_train's are; torch's own pool keeps one. bench_train runs it beside its own step when
PyTorch can be imported.
"""
import argparse
import math
import os
import statistics
import sys
import time

ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
ap.add_argument("--threads", type=int, default=1)
ap.add_argument("--steps", type=int, default=6)
args = ap.parse_args()
# Debian's torch does its matmuls in OpenBLAS's own thread pool, which torch.set_num_threads does
# not size: without this, "one thread" runs sgemm on every core. Set before torch loads it.
# torch's own (OpenMP) pool stays at one thread, as ffrun's element-wise loops do: on the 2-core
# development VM, 2 OpenMP threads beside 2 OpenBLAS threads took 7.4 s a step against 3.4 s.
os.environ["OPENBLAS_NUM_THREADS"] = str(args.threads)
os.environ["OMP_NUM_THREADS"] = "1"
try:
    import torch
except ImportError:
    print("torch_step: PyTorch is not installed (scripts/setup installs python3-torch)",
          file=sys.stderr)
    sys.exit(3)

H, HEADS, FFN, LAYERS, S, V, B, MBS = 512, 8, 1376, 8, 256, 256, 8, 4
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def rms(x, w):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * w


def rope(x, cos, sin):  # x (b, s, heads, d), pairs (2i, 2i+1)
    x0, x1 = x[..., 0::2], x[..., 1::2]
    return torch.stack((x0 * cos - x1 * sin, x0 * sin + x1 * cos), dim=-1).flatten(-2)


class Llama(torch.nn.Module):
    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed(1234)

        def p(*shape, std=0.02):
            return torch.nn.Parameter(torch.randn(*shape, generator=g) * std)

        self.embed = p(V, H)
        self.layers = torch.nn.ModuleList()
        for _ in range(LAYERS):
            layer = torch.nn.Module()
            layer.attn_norm, layer.mlp_norm = (torch.nn.Parameter(torch.ones(H)) for _ in "ab")
            layer.wq, layer.wk, layer.wv, layer.wo = (p(H, H) for _ in "abcd")
            layer.w_gate, layer.w_up, layer.w_down = p(FFN, H), p(FFN, H), p(H, FFN)
            self.layers.append(layer)
        self.final_norm = torch.nn.Parameter(torch.ones(H))
        self.lm_head = p(V, H)
        d = H // HEADS
        inv = 10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float32) / d)
        ang = torch.arange(S, dtype=torch.float32)[:, None] * inv[None, :]
        self.cos, self.sin = ang.cos()[None, :, None, :], ang.sin()[None, :, None, :]
        self.mask = torch.full((S, S), float("-inf")).triu(1)

    def forward(self, tokens):
        b, d = tokens.shape[0], H // HEADS
        x = self.embed[tokens]
        for L in self.layers:
            h = rms(x, L.attn_norm)
            q = rope((h @ L.wq.t()).view(b, S, HEADS, d), self.cos, self.sin).transpose(1, 2)
            k = rope((h @ L.wk.t()).view(b, S, HEADS, d), self.cos, self.sin).transpose(1, 2)
            v = (h @ L.wv.t()).view(b, S, HEADS, d).transpose(1, 2)
            att = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(d) + self.mask, dim=-1)
            x = x + (att @ v).transpose(1, 2).reshape(b, S, H) @ L.wo.t()
            h = rms(x, L.mlp_norm)
            x = x + (torch.nn.functional.silu(h @ L.w_gate.t()) * (h @ L.w_up.t())) @ L.w_down.t()
        return rms(x, self.final_norm) @ self.lm_head.t()


def main():
    torch.set_num_threads(1)
    with open(os.path.join(ROOT, "LICENSE"), "rb") as fh:
        text = torch.tensor(list(fh.read()), dtype=torch.long)
    model = Llama()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95), eps=1e-8,
                            weight_decay=0.1)
    times = []
    for step in range(args.steps + 1):  # step 0 warms up
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=False)
        for mb in range(B // MBS):
            at = [((step * B + mb * MBS + i) * S) % (len(text) - S - 1) for i in range(MBS)]
            seq = torch.stack([text[a:a + S + 1] for a in at])
            logits = model(seq[:, :-1])
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, V), seq[:, 1:].reshape(-1),
                                                     reduction="sum") / (B * S)
            loss.backward()
        opt.step()
        if step > 0:
            times.append(time.perf_counter() - t0)
    print(f"torch_step_ms {1e3 * statistics.median(times):.1f} {torch.__version__} {args.threads}")


if __name__ == "__main__":
    main()
