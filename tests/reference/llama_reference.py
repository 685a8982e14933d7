#!/usr/bin/python3
"""llama_reference.py FFRUN FFPLAN — ffrun's model against an independent one in PyTorch.

ffrun trains the tiny model of profiles/plans/tiny-1rank.json on LICENSE for three steps and
saves, at every step, its parameters and the step's gradients (safetensors, logical tensors).
PyTorch (float64) builds the same Llama from ffrun's initial weights, computes the loss and every
gradient on the same global batch (sequence j of step t at the same offset), and applies
torch.optim.AdamW with the same clipping and learning rate. The loss, every gradient and every
updated parameter must agree to relative 1e-5 (‖ffrun − torch‖ / ‖torch‖ per tensor).

PyTorch comes from Debian's python3-torch, which scripts/setup installs. Without it the script
fails, saying so: it does not quietly check less. `--committed` asks for the lesser check
explicitly: ffrun against the figures the reference produced last time, committed in
expected.json (the losses and, per tensor, the norms of the gradients and of the updated
parameters). `--update` rewrites expected.json (with torch). The run's losses are read through
`FFPLAN metrics`, the strict metrics reader.
"""
import json
import math
import os
import struct
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
PLAN = os.path.join(ROOT, "profiles/plans/tiny-1rank.json")
TEXT = os.path.join(ROOT, "LICENSE")
STEPS = 3
TOL = 1e-5


def read_safetensors(path):
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n])
    meta = header.pop("__metadata__", {})
    tensors = {}
    for name, t in header.items():
        a, b = t["data_offsets"]
        count = (b - a) // 4
        values = struct.unpack("<%df" % count, blob[8 + n + a:8 + n + b])
        tensors[name] = (tuple(t["shape"]), values)
    return meta, tensors


def run_ffrun(ffrun, ffplan, workdir):
    ckpt = os.path.join(workdir, "ckpt")
    metrics = os.path.join(workdir, "metrics.jsonl")
    subprocess.run([ffrun, PLAN, "--text", TEXT, "--steps", str(STEPS), "--checkpoint-dir", ckpt,
                    "--checkpoint-every", "1", "--checkpoint-gradients", "--metrics", metrics,
                    "--quiet"], check=True)
    got = subprocess.run([ffplan, "metrics", metrics, "--get", "loss"], check=True,
                         stdout=subprocess.PIPE, text=True).stdout
    losses = [float("nan") if x == "null" else float(x) for x in got.split()]
    steps = [read_safetensors(os.path.join(ckpt, "step-%08d.safetensors" % s))[1]
             for s in range(STEPS + 1)]
    return losses, steps


def norm(values):
    return math.sqrt(sum(v * v for v in values))


def rel_err(ours, ref):
    diff = math.sqrt(sum((a - b) ** 2 for a, b in zip(ours, ref)))
    scale = norm(ref)
    return diff / scale if scale > 0 else diff


class Failures:
    def __init__(self):
        self.count = 0
        self.checks = 0
        self.largest = 0.0

    def check(self, what, err):
        self.checks += 1
        self.largest = max(self.largest, err)
        if not err <= TOL:
            self.count += 1
            print("FAIL: %s: relative error %.3g > %g" % (what, err, TOL))


def reference(ffrun_steps, losses, fails, update):
    import torch  # noqa: E402 (only when present)
    torch.set_default_dtype(torch.float64)
    plan = json.load(open(PLAN))
    model, training = plan["inputs"]["model"], plan["inputs"]["training"]  # inline in a written plan
    L, C, H, K = model["layers"], model["hidden"], model["heads"], model["kv_heads"]
    S, D, eps, theta = model["seq_len"], model["hidden"] // model["heads"], model["norm_eps"], model["rope_theta"]
    GB = training["global_batch"]
    opt = training.get("optimizer", {})
    lr0, wd = opt.get("lr", 3e-4), opt.get("weight_decay", 0.1)
    b1, b2, adam_eps, clip = opt.get("beta1", 0.9), opt.get("beta2", 0.95), opt.get("eps", 1e-8), opt.get("grad_clip", 1.0)
    sched = training.get("lr_schedule", {})
    warmup, min_lr, total = sched.get("warmup_steps", 0), sched.get("min_lr", lr0 / 10), training["steps"]

    def lr_at(t):
        if warmup > 0 and t <= warmup:
            return lr0 * t / warmup
        p = min(1.0, (t - warmup) / (total - warmup))
        return min_lr + 0.5 * (lr0 - min_lr) * (1 + math.cos(math.pi * p))

    init = ffrun_steps[0]
    params = {name: torch.tensor(vals).reshape(shape).clone().requires_grad_(True)
              for name, (shape, vals) in init.items() if "." not in name or name.startswith("layers.")}
    decay = [p for n, p in params.items() if "norm" not in n]
    no_decay = [p for n, p in params.items() if "norm" in n]
    optim = torch.optim.AdamW([{"params": decay, "weight_decay": wd},
                               {"params": no_decay, "weight_decay": 0.0}],
                              lr=lr0, betas=(b1, b2), eps=adam_eps)
    data = open(TEXT, "rb").read()

    def rmsnorm(x, w):
        return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * w

    pos = torch.arange(S, dtype=torch.float64)
    inv = theta ** (-2.0 * torch.arange(D // 2, dtype=torch.float64) / D)
    ang = pos[:, None] * inv[None, :]  # (S, D/2)
    cos, sin = torch.cos(ang)[None, :, None, :], torch.sin(ang)[None, :, None, :]

    def rope(x):  # (B, S, heads, D), pairs (2i, 2i+1)
        a, b = x[..., 0::2], x[..., 1::2]
        out = torch.empty_like(x)
        out[..., 0::2] = a * cos - b * sin
        out[..., 1::2] = a * sin + b * cos
        return out

    def forward(tokens, targets):
        p = params
        x = p["embed"][tokens]
        B = tokens.shape[0]
        mask = torch.triu(torch.ones(S, S, dtype=torch.bool), 1)
        for l in range(L):
            q_ = lambda n: p["layers.%d.%s" % (l, n)]
            h = rmsnorm(x, q_("attn_norm"))
            q = rope((h @ q_("wq").T).view(B, S, H, D))
            k = rope((h @ q_("wk").T).view(B, S, K, D))
            v = (h @ q_("wv").T).view(B, S, K, D)
            k = k.repeat_interleave(H // K, dim=2)
            v = v.repeat_interleave(H // K, dim=2)
            scores = torch.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(D)
            scores = scores.masked_fill(mask, float("-inf"))
            att = torch.einsum("bhqk,bkhd->bqhd", torch.softmax(scores, -1), v).reshape(B, S, H * D)
            x = x + att @ q_("wo").T
            h2 = rmsnorm(x, q_("mlp_norm"))
            g, u = h2 @ q_("w_gate").T, h2 @ q_("w_up").T
            x = x + (torch.nn.functional.silu(g) * u) @ q_("w_down").T
        logits = rmsnorm(x, p["final_norm"]) @ p["lm_head"].T
        return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                 targets.reshape(-1), reduction="sum") / (GB * S)

    expected = {"losses": [], "grad_norms": [], "param_norms": []}
    for t in range(1, STEPS + 1):
        tok, tgt = [], []
        for j in range(GB):
            off = ((t - 1) * GB + j) * S % (len(data) - S)
            tok.append(list(data[off:off + S]))
            tgt.append(list(data[off + 1:off + S + 1]))
        optim.zero_grad()
        loss = forward(torch.tensor(tok), torch.tensor(tgt))
        loss.backward()
        fails.check("step %d loss" % t, abs(losses[t - 1] - loss.item()) / abs(loss.item()))
        ours = ffrun_steps[t]
        grad_norms = {}
        for name, prm in params.items():
            ref = prm.grad.flatten().tolist()
            fails.check("step %d gradient of %s" % (t, name), rel_err(ours["grad." + name][1], ref))
            grad_norms[name] = norm(ref)
        total_norm = math.sqrt(sum(n * n for n in grad_norms.values()))
        scale = clip / total_norm if clip > 0 and total_norm > clip else 1.0
        for prm in params.values():
            prm.grad.mul_(scale)
        for group in optim.param_groups:
            group["lr"] = lr_at(t)
        optim.step()
        param_norms = {}
        for name, prm in params.items():
            ref = prm.detach().flatten().tolist()
            fails.check("step %d parameter %s" % (t, name), rel_err(ours[name][1], ref))
            param_norms[name] = norm(ref)
        expected["losses"].append(loss.item())
        expected["grad_norms"].append(grad_norms)
        expected["param_norms"].append(param_norms)
    if update:
        with open(os.path.join(HERE, "expected.json"), "w") as f:
            json.dump(expected, f, indent=1, sort_keys=True)
            f.write("\n")


def committed(ffrun_steps, losses, fails):
    expected = json.load(open(os.path.join(HERE, "expected.json")))
    for t in range(1, STEPS + 1):
        ref = expected["losses"][t - 1]
        fails.check("step %d loss (committed)" % t, abs(losses[t - 1] - ref) / abs(ref))
        for name, ref in expected["grad_norms"][t - 1].items():
            ours = norm(ffrun_steps[t]["grad." + name][1])
            fails.check("step %d gradient norm of %s (committed)" % (t, name), abs(ours - ref) / ref if ref else ours)
        for name, ref in expected["param_norms"][t - 1].items():
            ours = norm(ffrun_steps[t][name][1])
            fails.check("step %d parameter norm of %s (committed)" % (t, name), abs(ours - ref) / ref)


def main():
    positional = [a for a in sys.argv[1:] if not a.startswith("--")]
    if len(positional) != 2:
        print("usage: llama_reference.py FFRUN FFPLAN [--committed | --update]")
        sys.exit(2)
    ffrun, ffplan = positional
    update = "--update" in sys.argv
    only_committed = "--committed" in sys.argv
    try:
        import torch  # noqa: F401
        have_torch = True
    except ImportError:
        have_torch = False
    if not have_torch and not only_committed:
        print("reference: PyTorch is not installed (%s): run scripts/setup, which installs "
              "Debian's python3-torch, or pass --committed to check against expected.json only"
              % sys.executable)
        sys.exit(1)
    fails = Failures()
    with tempfile.TemporaryDirectory() as work:
        losses, steps = run_ffrun(ffrun, ffplan, work)
        if have_torch and not only_committed:
            reference(steps, losses, fails, update)
            how = "against PyTorch"
        else:
            committed(steps, losses, fails)
            how = "against committed reference values (--committed)"
    print("reference %s: %d checks, largest relative error %.2g, %d failed"
          % (how, fails.checks, fails.largest, fails.count))
    sys.exit(1 if fails.count else 0)


if __name__ == "__main__":
    main()
