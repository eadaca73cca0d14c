"""The tinylm Transformer LM in PyTorch: a reference to check `tinylm forward`
against, and a training-step benchmark of PyTorch on the CPU.

The model is SPEC §2 (Stanford CS336 assignment 1) with the CS336 parameter names
and `(out, in)` shapes, no biases, RMSNorm (eps 1e-5), RoPE on adjacent pairs
`(2k, 2k+1)`, causal multi-head attention, SwiGLU, and the ablation switches of
tinylm's config JSON (`norm`, `positional`, `ffn`, `tie_embeddings`).

    # compare logits, loss and every gradient with tinylm (float64 and float32 PyTorch)
    python bench/torch_model.py --check --config model.json [--tinylm target/release/tinylm]
    # training-step throughput (forward + backward + AdamW), one JSON line per variant
    python bench/torch_model.py --bench [--config model.json] [--batch-size 16] [--threads 2]
    python bench/torch_model.py --bench --device cuda --variants eager,compile-bf16
    # the GPU's bf16 matrix-product rate (the MFU's denominator)
    python bench/torch_model.py --matmul-peak

Without --config, the model is the benchmark config (tinylm bench's default): vocab 4,096,
context 128, d_model 256, 4 layers, 8 heads, d_ff 704 (SwiGLU, RoPE, pre-norm).
"""

import argparse
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

BENCH_CONFIG = {
    "vocab_size": 4096,
    "context_length": 128,
    "d_model": 256,
    "num_layers": 4,
    "num_heads": 8,
    "d_ff": 704,
    "rope_theta": 10000.0,
    "norm": "pre",
    "positional": "rope",
    "ffn": "swiglu",
    "tie_embeddings": False,
}


class Linear(nn.Module):
    """`y = x Wᵀ`, weight `(out, in)`, no bias."""

    def __init__(self, d_in, d_out):
        super().__init__()
        std = math.sqrt(2.0 / (d_in + d_out))
        self.weight = nn.Parameter(torch.empty(d_out, d_in))
        nn.init.trunc_normal_(self.weight, 0.0, std, -3 * std, 3 * std)

    def forward(self, x):
        return x @ self.weight.T


class Embedding(nn.Module):
    """Row lookup in `weight (vocab_size, d_model)`."""

    def __init__(self, vocab_size, d_model, std=1.0):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(vocab_size, d_model))
        nn.init.trunc_normal_(self.weight, 0.0, std, -3 * std, 3 * std)

    def forward(self, ids):
        return self.weight[ids]


class RMSNorm(nn.Module):
    """`a / sqrt(mean(a²) + eps) * g`, computed in at least float32."""

    def __init__(self, d_model, eps=1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d_model))

    def forward(self, x):
        dtype = x.dtype
        x = x.to(torch.promote_types(dtype, torch.float32))
        rms = torch.sqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return (x / rms * self.weight).to(dtype)


class RoPE(nn.Module):
    """Rotates adjacent pairs `(x_2k, x_2k+1)` of `(..., T, d_k)` by `i / Θ^(2k/d_k)`."""

    def __init__(self, theta, d_k, max_seq_len):
        super().__init__()
        k = torch.arange(0, d_k, 2, dtype=torch.float64) / d_k
        angle = torch.arange(max_seq_len, dtype=torch.float64)[:, None] / theta**k
        self.register_buffer("cos", angle.cos(), persistent=False)
        self.register_buffer("sin", angle.sin(), persistent=False)

    def forward(self, x, positions):
        cos = self.cos[positions].to(x.dtype)
        sin = self.sin[positions].to(x.dtype)
        x1, x2 = x[..., 0::2], x[..., 1::2]
        return torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention; `sdpa` selects PyTorch's fused kernel."""

    def __init__(self, d_model, num_heads, rope, sdpa):
        super().__init__()
        self.num_heads = num_heads
        self.rope = rope
        self.sdpa = sdpa
        self.q_proj = Linear(d_model, d_model)
        self.k_proj = Linear(d_model, d_model)
        self.v_proj = Linear(d_model, d_model)
        self.output_proj = Linear(d_model, d_model)

    def forward(self, x):
        b, t, d = x.shape
        # (B, T, C) -> (B, H, T, d_k); head h owns rows h·d_k .. (h+1)·d_k.
        split = lambda y: y.view(b, t, self.num_heads, d // self.num_heads).transpose(1, 2)
        q, k, v = split(self.q_proj(x)), split(self.k_proj(x)), split(self.v_proj(x))
        if self.rope is not None:
            positions = torch.arange(t, device=x.device)
            q, k = self.rope(q, positions), self.rope(k, positions)
        if self.sdpa:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
            mask = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
            scores = scores.masked_fill(~mask, float("-inf"))
            y = torch.softmax(scores, dim=-1) @ v
        return self.output_proj(y.transpose(1, 2).reshape(b, t, d))


class FFN(nn.Module):
    """SwiGLU `W2 (SiLU(W1 x) ⊙ W3 x)` or SiLU `W2 SiLU(W1 x)`."""

    def __init__(self, d_model, d_ff, swiglu):
        super().__init__()
        self.w1 = Linear(d_model, d_ff)
        self.w2 = Linear(d_ff, d_model)
        self.w3 = Linear(d_model, d_ff) if swiglu else None

    def forward(self, x):
        h = F.silu(self.w1(x))
        if self.w3 is not None:
            h = h * self.w3(x)
        return self.w2(h)


class Block(nn.Module):
    def __init__(self, c, rope, sdpa):
        super().__init__()
        self.norm = c["norm"]
        has_norm = self.norm != "none"
        self.ln1 = RMSNorm(c["d_model"]) if has_norm else None
        self.attn = CausalSelfAttention(c["d_model"], c["num_heads"], rope, sdpa)
        self.ln2 = RMSNorm(c["d_model"]) if has_norm else None
        self.ffn = FFN(c["d_model"], c["d_ff"], c["ffn"] == "swiglu")

    def forward(self, x):
        if self.norm == "pre":
            x = x + self.attn(self.ln1(x))
            return x + self.ffn(self.ln2(x))
        if self.norm == "post":
            x = self.ln1(x + self.attn(x))
            return self.ln2(x + self.ffn(x))
        x = x + self.attn(x)
        return x + self.ffn(x)


class TransformerLM(nn.Module):
    """Token ids `(B, T)` -> logits `(B, T, V)`; state_dict names as tinylm's."""

    def __init__(self, c, sdpa=False):
        super().__init__()
        d, v = c["d_model"], c["vocab_size"]
        tied = c.get("tie_embeddings", False)
        # A tied matrix is also the output projection: it takes the linear init.
        self.token_embeddings = Embedding(v, d, math.sqrt(2.0 / (v + d)) if tied else 1.0)
        rope = None
        if c.get("positional", "rope") == "rope":
            rope = RoPE(c.get("rope_theta", 10000.0), d // c["num_heads"], c["context_length"])
        self.layers = nn.ModuleList(Block(c, rope, sdpa) for _ in range(c["num_layers"]))
        self.ln_final = RMSNorm(d) if c["norm"] == "pre" else None
        self.lm_head = None if tied else Linear(d, v)

    def forward(self, ids):
        x = self.token_embeddings(ids)
        for layer in self.layers:
            x = layer(x)
        if self.ln_final is not None:
            x = self.ln_final(x)
        head = self.token_embeddings.weight if self.lm_head is None else self.lm_head.weight
        return x @ head.T


def load_config(path):
    c = dict(BENCH_CONFIG)
    if path:
        with open(path) as f:
            c.update(json.load(f))
    return c


def forward_flops(c, b, t):
    """2mnp FLOPs of every matmul of a forward pass (as `tinylm info`)."""
    d, f, v, n = c["d_model"], c["d_ff"], c["vocab_size"], c["num_layers"]
    ffn_mats = 3 if c["ffn"] == "swiglu" else 2
    per_layer = 2 * b * t * (4 * d * d + ffn_mats * d * f) + 2 * 2 * b * t * t * d
    return n * per_layer + 2 * b * t * d * v


def max_rel_err(ours, ref):
    """max |ours − ref| / max |ref|: the error relative to the tensor's scale."""
    ref = ref.double()
    return ((ours.double() - ref).abs().max() / ref.abs().max().clamp_min(1e-30)).item()


def check(args):
    from safetensors.torch import load_file, save_file

    c = load_config(args.config)
    torch.manual_seed(args.seed)
    model = TransformerLM(c)
    with torch.no_grad():  # gains away from 1 so their gradients are exercised
        for p in model.parameters():
            if p.dim() == 1:
                p.add_(0.1 * torch.randn_like(p))
    b, t = args.batch_size, args.seq_len or c["context_length"]
    rng = np.random.default_rng(args.seed)
    ids = rng.integers(0, c["vocab_size"], size=(b, t), dtype=np.int64)
    targets = rng.integers(0, c["vocab_size"], size=(b, t), dtype=np.int64)
    with tempfile.TemporaryDirectory() as tmp:
        paths = {n: os.path.join(tmp, n) for n in
                 ["config.json", "w.safetensors", "ids.npy", "targets.npy", "logits.npy", "grads.safetensors"]}
        with open(paths["config.json"], "w") as f:
            json.dump(c, f)
        save_file({k: v.float().contiguous() for k, v in model.state_dict().items()}, paths["w.safetensors"])
        np.save(paths["ids.npy"], ids.astype(args.ids_dtype))
        np.save(paths["targets.npy"], targets.astype(args.ids_dtype))
        cmd = [args.tinylm, "forward", "--config", paths["config.json"], "--weights", paths["w.safetensors"],
               "--input", paths["ids.npy"], "--targets", paths["targets.npy"],
               "--logits-out", paths["logits.npy"], "--grads-out", paths["grads.safetensors"],
               "--precision", "fp32"]
        run = subprocess.run(cmd, capture_output=True, text=True)
        if run.returncode != 0:
            sys.exit(f"tinylm forward failed ({run.returncode}):\n{run.stderr}")
        loss_line = re.search(r"^loss\s+(\S+)", run.stdout, re.M)
        if not loss_line:
            sys.exit(f"no 'loss' line in tinylm's output:\n{run.stdout}")
        ours = {"loss": torch.tensor(float(loss_line.group(1))),
                "logits": torch.from_numpy(np.load(paths["logits.npy"]))}
        grads = load_file(paths["grads.safetensors"])
    names = dict(model.named_parameters()).keys()
    if set(grads) != set(names):
        sys.exit(f"gradient names differ: missing {set(names) - set(grads)}, extra {set(grads) - set(names)}")
    ours.update({f"grad {n}": g for n, g in grads.items()})

    worst = {}
    for dtype in (torch.float64, torch.float32):
        ref_model = TransformerLM(c).to(dtype)
        # The weights exactly as tinylm read them (rounded to float32).
        ref_model.load_state_dict({k: v.float().to(dtype) for k, v in model.state_dict().items()})
        logits = ref_model(torch.from_numpy(ids))
        loss = F.cross_entropy(logits.reshape(-1, c["vocab_size"]), torch.from_numpy(targets).reshape(-1))
        loss.backward()
        ref = {"loss": loss.detach(), "logits": logits.detach()}
        ref.update({f"grad {n}": p.grad for n, p in ref_model.named_parameters()})
        errs = {k: max_rel_err(ours[k], ref[k]) for k in ref}
        worst[str(dtype).removeprefix("torch.")] = errs
    label = ", ".join(f"{k}={c[k]}" for k in ("norm", "positional", "ffn", "tie_embeddings"))
    ok = True
    for dtype, errs in worst.items():
        name, err = max(errs.items(), key=lambda kv: kv[1])
        print(json.dumps({"config": label, "vs_torch": dtype, "loss_tinylm": ours["loss"].item(),
                          "loss_err": errs["loss"], "logits_err": errs["logits"],
                          "max_grad_err": max(v for k, v in errs.items() if k.startswith("grad")),
                          "worst": name, "worst_err": err, "tensors": len(errs)}))
        ok &= err <= args.tolerance
    if not ok:
        sys.exit(f"max relative error above {args.tolerance}")


def bench(args):
    """Training steps per variant: `eager` (fp32, attention written out), `sdpa` (fp32,
    PyTorch's fused attention), `compile` (torch.compile of sdpa and the loss), each
    also with `-bf16` (bf16 autocast; `compile-bf16` is PyTorch's fastest
    configuration, with flash attention on a GPU)."""
    c = load_config(args.config)
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    b, t = args.batch_size, args.seq_len or c["context_length"]
    flops = 3 * forward_flops(c, b, t)
    for variant in args.variants.split(","):
        # "-bf16": forward and loss under autocast to bf16 (PyTorch's mixed precision).
        base, bf16 = variant.removesuffix("-bf16"), variant.endswith("-bf16")
        if base not in ("eager", "sdpa", "compile"):
            sys.exit(f"unknown variant {variant!r}: eager, sdpa or compile, each also with -bf16")
        torch.manual_seed(0)
        model = TransformerLM(c, sdpa=base != "eager").to(device)
        # On a GPU, PyTorch's fastest AdamW: one fused kernel.
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1,
                                **({"fused": True} if cuda else {}))
        ids = torch.randint(0, c["vocab_size"], (b, t), device=device)
        targets = torch.randint(0, c["vocab_size"], (b, t), device=device)

        def model_loss(ids, targets):
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
                logits = model(ids)
            return F.cross_entropy(logits.float().reshape(-1, c["vocab_size"]), targets.reshape(-1))

        # Compiled, the loss is in the graph too: its kernels fuse with the LM head's.
        loss_of = torch.compile(model_loss) if base == "compile" else model_loss

        def step():
            loss = loss_of(ids, targets)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            return loss

        def sync():
            if cuda:
                torch.cuda.synchronize()

        for _ in range(args.warmup):
            step()
        sync()
        best = math.inf
        for _ in range(args.repeat):
            start = time.perf_counter()
            for _ in range(args.steps):
                step()
            sync()
            best = min(best, (time.perf_counter() - start) / args.steps)
        print(json.dumps({"variant": f"torch {variant}", "torch": torch.__version__, "device": str(device),
                          "threads": args.threads, "batch_size": b, "seq_len": t,
                          "ms_per_step": round(best * 1e3, 3), "tokens_per_s": round(b * t / best, 1),
                          "gflops": round(flops / best / 1e9, 1)}),
              flush=True)
        del model, opt, loss_of


def matmul_peak(args):
    """The GPU's bf16 matrix-product rate: n×n×n products on random data through
    PyTorch (cuBLAS), the median of timed runs over rotating inputs after warm-up."""
    n, reps = args.peak_size, 20
    pairs = [(torch.randn(n, n, device="cuda", dtype=torch.bfloat16),
              torch.randn(n, n, device="cuda", dtype=torch.bfloat16)) for _ in range(3)]
    for a, w in pairs:
        a @ w
    times = []
    for i in range(reps):
        a, w = pairs[i % len(pairs)]
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        a @ w
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e-3)
    median = sorted(times)[len(times) // 2]
    print(json.dumps({"variant": "bf16 matmul peak", "gpu": torch.cuda.get_device_name(), "n": n,
                      "tflops": round(2 * n**3 / median / 1e12, 1), "torch": torch.__version__}), flush=True)


def main():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument("--check", action="store_true", help="compare `tinylm forward` with PyTorch")
    mode.add_argument("--bench", action="store_true", help="training-step throughput of PyTorch")
    mode.add_argument("--matmul-peak", action="store_true", help="the GPU's bf16 matrix-product rate")
    p.add_argument("--config", help="model config JSON (default: the benchmark model of tinylm bench)")
    p.add_argument("--batch-size", type=int, help="default: 16 for --bench, 2 for --check")
    p.add_argument("--seq-len", type=int, help="default: the context length")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tinylm", default=os.path.join(root, "target", "release", "tinylm"))
    p.add_argument("--ids-dtype", default="int64", choices=["int64", "int32", "uint16", "uint32"])
    p.add_argument("--tolerance", type=float, default=1e-4, help="max relative error allowed in --check")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--variants", default="eager,sdpa,compile",
                   help="comma-separated: eager, sdpa, compile, each also with -bf16 (autocast)")
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    p.add_argument("--peak-size", type=int, default=8192, help="n of --matmul-peak's n×n×n products")
    p.add_argument("--steps", type=int, default=10, help="timed steps per repeat")
    p.add_argument("--repeat", type=int, default=3, help="best of this many repeats")
    p.add_argument("--warmup", type=int, default=3)
    args = p.parse_args()
    if args.batch_size is None:
        args.batch_size = 16 if args.bench else 2
    if args.matmul_peak:
        matmul_peak(args)
    else:
        check(args) if args.check else bench(args)


if __name__ == "__main__":
    main()
