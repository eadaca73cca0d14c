"""Repeats a tinylm training run in PyTorch, step for step: the same model
(bench/torch_model.py), initial weights, batches, optimizer and schedule, with the
same validation windows and the same JSONL log, so both runs can be compared.

    python bench/torch_train.py --run runs/x --variant compile --out runs/x-torch

`--run` is a tinylm run directory holding `checkpoint.safetensors` (its metadata
gives the training config and the number of steps taken) and `init.safetensors`
(the step-0 weights: `tinylm quickstart --save-init`). What is reproduced:

- batches: SplitMix64 seeded with the training seed; each batch draws its B start
  indices with rejection sampling below `n − T` (crates/tinylm/src/data.rs);
- step k (from 0): learning rate `lr_cosine_schedule(k)` — or, for a run whose
  schedule follows the clock (`schedule = "time"`, as `tinylm quickstart` trains),
  the learning rate tinylm's `log.jsonl` gives step k+1 — gradient clipping to the
  global norm `M` by `M/(norm + 1e-6)`, AdamW step k+1 exactly as SPEC §3 and
  crates/tinylm/src/optim.rs (`θ ← θ − α_t m/(√v + ε)`, then `θ ← θ(1 − αλ)`);
- validation: windows of T+1 tokens at 0, T, 2T, …, batches of B consecutive
  windows, the first `eval_batches` batches (0: all), at the same steps;
- the log `log.jsonl`: `step, tokens, wallclock_s, train_loss, val_loss, lr,
  grad_norm, tokens_per_s` (wall-clock includes evaluation and compilation).

At the end it prints one JSON line: steps, wall-clock, training tokens/s and the
validation loss over all windows.

Variants: `eager` (PyTorch's fused scaled_dot_product_attention, no compile) and
`compile` (the same model through torch.compile); `eager-bf16` and `compile-bf16`
run the forward pass and the loss under `torch.autocast("cpu", dtype=torch.bfloat16)`
(PyTorch's bf16 mixed precision: float32 weights, gradients and AdamW). `--threads`
(default 2) sets torch.set_num_threads.
"""

import argparse
import json
import math
import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F
from safetensors import safe_open
from safetensors.torch import load_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_model import TransformerLM  # noqa: E402

M64 = (1 << 64) - 1


class SplitMix64:
    """tinylm's batch generator (crates/tinylm/src/data.rs)."""

    def __init__(self, seed):
        self.state = seed & M64

    def next_u64(self):
        self.state = (self.state + 0x9E3779B97F4A7C15) & M64
        z = self.state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
        return z ^ (z >> 31)

    def below(self, k):
        limit = (1 << 64) - ((1 << 64) % k)
        while True:
            x = self.next_u64()
            if x < limit:
                return x % k


def lr_cosine_schedule(it, max_lr, min_lr, warmup, cycle):
    if it < warmup:
        return max_lr * it / warmup
    if it <= cycle:
        progress = (it - warmup) / (cycle - warmup) if cycle > warmup else 0.0
        return min_lr + 0.5 * (1 + math.cos(math.pi * progress)) * (max_lr - min_lr)
    return min_lr


class AdamW:
    """SPEC §3 AdamW on a list of tensors, in the order of tinylm's optim.rs."""

    def __init__(self, params, beta1, beta2, eps, weight_decay):
        self.params = params
        self.b1, self.b2, self.eps, self.wd = beta1, beta2, eps, weight_decay
        self.m = [torch.zeros_like(p) for p in params]
        self.v = [torch.zeros_like(p) for p in params]
        self.t = 0

    @torch.no_grad()
    def step(self, lr):
        self.t += 1
        grads = [p.grad for p in self.params]
        alpha_t = lr * math.sqrt(1 - self.b2**self.t) / (1 - self.b1**self.t)
        torch._foreach_mul_(self.m, self.b1)
        torch._foreach_add_(self.m, grads, alpha=1 - self.b1)
        torch._foreach_mul_(self.v, self.b2)
        torch._foreach_addcmul_(self.v, grads, grads, value=1 - self.b2)
        denom = torch._foreach_sqrt(self.v)
        torch._foreach_add_(denom, self.eps)
        torch._foreach_addcdiv_(self.params, self.m, denom, value=-alpha_t)
        torch._foreach_mul_(self.params, 1 - lr * self.wd)


def fill_random(data, rng, b, t):
    """B windows at start indices drawn from `rng`: inputs and next-token targets (B, T)."""
    starts = [rng.below(len(data) - t) for _ in range(b)]
    rows = np.stack([data[s : s + t + 1] for s in starts]).astype(np.int64)
    rows = torch.from_numpy(rows)
    return rows[:, :-1], rows[:, 1:]


@torch.no_grad()
def evaluate(model, data, b, t, max_batches):
    """Mean loss over the first `max_batches` batches (0: all) of validation windows."""
    windows = (len(data) - 1) // t
    total, done, batches = 0.0, 0, 0
    while done < windows and (max_batches == 0 or batches < max_batches):
        rows = min(b, windows - done)
        x = np.stack([data[(done + r) * t : (done + r) * t + t + 1] for r in range(rows)]).astype(np.int64)
        x = torch.from_numpy(x)
        logits = model(x[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1))
        total += loss.item() * rows
        done += rows
        batches += 1
    return total / done


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run", required=True, help="tinylm run directory (checkpoint.safetensors, init.safetensors)")
    p.add_argument("--variant", choices=["eager", "compile", "eager-bf16", "compile-bf16"], default="eager")
    p.add_argument("--out", required=True, help="directory for this run's log.jsonl")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--steps", type=int, help="steps to run (default: as many as the tinylm run took)")
    args = p.parse_args()

    ckpt = os.path.join(args.run, "checkpoint.safetensors")
    with safe_open(ckpt, "pt") as f:
        meta = f.metadata()
    cfg = json.loads(meta["train_config"])
    c = cfg["model"]
    b, t = cfg["batch_size"], c["context_length"]
    total = math.ceil(cfg["max_tokens"] / (b * t)) if cfg.get("max_tokens") else cfg["steps"]
    cycle = cfg["cosine_steps"] if cfg.get("cosine_steps") is not None else total
    steps = args.steps or json.loads(meta["step"])
    if cfg.get("schedule") == "time":
        with open(os.path.join(args.run, "log.jsonl")) as f:
            logged_lr = {r["step"]: r["lr"] for r in map(json.loads, f)}
        missing = [k for k in range(1, steps + 1) if k not in logged_lr]
        if missing:
            sys.exit(f"{args.run}/log.jsonl: no learning rate for step {missing[0]} (log_interval must be 1)")

        def learning_rate(k):
            return logged_lr[k + 1]
    else:
        def learning_rate(k):
            return lr_cosine_schedule(k, cfg["lr_max"], cfg["lr_min"], cfg["warmup_steps"], cycle)

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = TransformerLM(c, sdpa=True)
    init = {k: v for k, v in load_file(os.path.join(args.run, "init.safetensors")).items()
            if not k.startswith("optim.")}
    model.load_state_dict(init, strict=True)
    base, bf16 = args.variant.removesuffix("-bf16"), args.variant.endswith("-bf16")
    fwd = torch.compile(model) if base == "compile" else model
    params = list(model.parameters())
    opt = AdamW(params, cfg["beta1"], cfg["beta2"], cfg["eps"], cfg["weight_decay"])

    def resolve(path):
        return path if os.path.isabs(path) or os.path.exists(path) else os.path.join(args.run, os.path.basename(path))

    train = np.load(resolve(cfg["train_data"]), mmap_mode="r")
    val = np.load(resolve(cfg["val_data"]), mmap_mode="r")
    rng = SplitMix64(cfg["seed"])

    def validation_loss(max_batches):
        """`evaluate` in the variant's precision."""
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            return evaluate(model, val, b, t, max_batches)

    os.makedirs(args.out, exist_ok=True)
    log = open(os.path.join(args.out, "log.jsonl"), "w")
    started = time.perf_counter()
    window_tokens, window_s, tokens = 0, 0.0, 0
    train_s = 0.0
    for k in range(steps):
        lr = learning_rate(k)
        step_start = time.perf_counter()
        x, y = fill_random(train, rng, b, t)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            logits = fwd(x)
            loss = F.cross_entropy(logits.reshape(-1, c["vocab_size"]), y.reshape(-1))
        for q in params:
            q.grad = None
        loss.backward()
        clip = cfg["grad_clip"] if cfg["grad_clip"] > 0 else math.inf
        grad_norm = torch.nn.utils.clip_grad_norm_(params, clip, foreach=True).item()
        opt.step(lr)
        elapsed = time.perf_counter() - step_start
        window_s += elapsed
        train_s += elapsed
        window_tokens += b * t
        tokens += b * t
        done = k + 1
        last = done == steps
        eval_now = last or (cfg["eval_interval"] > 0 and done % cfg["eval_interval"] == 0)
        val_loss = validation_loss(cfg["eval_batches"]) if eval_now else None
        record = {"step": done, "tokens": tokens, "wallclock_s": time.perf_counter() - started,
                  "train_loss": loss.item(), "val_loss": val_loss, "lr": lr, "grad_norm": grad_norm,
                  "tokens_per_s": window_tokens / max(window_s, 1e-9)}
        if eval_now or done % cfg["log_interval"] == 0:
            log.write(json.dumps(record) + "\n")
            log.flush()
            window_tokens, window_s = 0, 0.0
        if done % 20 == 0 or last:
            print(f"  torch {args.variant}: step {done}/{steps} loss {loss.item():.3f} "
                  f"{record['wallclock_s']:.0f} s", file=sys.stderr, flush=True)
    wallclock = time.perf_counter() - started
    full_val = validation_loss(0)
    print(json.dumps({"run": f"torch {args.variant}", "torch": torch.__version__, "threads": args.threads,
                      "steps": steps, "wallclock_s": round(wallclock, 2),
                      "train_tokens_per_s": round(tokens / train_s, 1), "val_loss_all": round(full_val, 4)}))


if __name__ == "__main__":
    main()
