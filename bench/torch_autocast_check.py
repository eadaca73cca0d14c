"""tinylm's bf16 mixed precision against PyTorch's CPU autocast, on the same weights
and batch: logits, loss and every parameter gradient of `tinylm forward --precision
bf16` against `torch.autocast("cpu", dtype=torch.bfloat16)` on bench/torch_model.py's
model, within bf16 tolerances; and the same check failing for a model whose product
operands are truncated to bf16 instead of rounded to nearest (emulated in PyTorch:
every `matmul` operand cut to its upper 16 bits, sums in float32).

    PYTHON=.venv-bench/bin/python
    $PYTHON bench/torch_autocast_check.py [--config model.json] [--tinylm target/release/tinylm]

The check: for each tensor, max |ours − autocast| / max |autocast| within
--tolerance-logits (logits, loss) or --tolerance-grads (every gradient), and the
least-squares slope of our logits against autocast's within --tolerance-slope of 1
(unbiased rounding; truncation shrinks every operand and so the logits). It prints
one JSON line per candidate (tinylm fp32 and bf16, PyTorch with operands rounded to
nearest and truncated) and exits 1 unless tinylm bf16 passes and truncation fails.
"""

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

import numpy as np
import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_model import TransformerLM, load_config, max_rel_err  # noqa: E402


class Bf16Operands(TorchFunctionMode):
    """Every forward `matmul` on float32 operands cut to bf16: to nearest (ties to
    even) or truncated; the products summed in float32."""

    def __init__(self, truncate):
        super().__init__()
        self.truncate = truncate

    def cut(self, x):
        """`x`'s values cut to bf16, its gradient passed through as it is."""
        with torch.no_grad():
            if self.truncate:
                cut = (x.contiguous().view(torch.int32) & -65536).view(torch.float32)
            else:
                cut = x.to(torch.bfloat16).float()
        return x + (cut - x).detach()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if getattr(func, "__name__", None) in ("matmul", "__matmul__"):
            args = tuple(self.cut(a) if isinstance(a, torch.Tensor) else a for a in args)
        return func(*args, **kwargs)


def tinylm_forward(args, precision, paths):
    cmd = [args.tinylm, "forward", "--config", paths["config.json"], "--weights", paths["w.safetensors"],
           "--input", paths["ids.npy"], "--targets", paths["targets.npy"], "--precision", precision,
           "--logits-out", paths["logits.npy"], "--grads-out", paths["grads.safetensors"],
           "--threads", str(args.threads)]
    run = subprocess.run(cmd, capture_output=True, text=True)
    if run.returncode != 0:
        sys.exit(f"tinylm forward failed ({run.returncode}):\n{run.stderr}")
    from safetensors.torch import load_file
    out = {"loss": torch.tensor(float(re.search(r"^loss\s+(\S+)", run.stdout, re.M).group(1))),
           "logits": torch.from_numpy(np.load(paths["logits.npy"]))}
    out.update({f"grad {n}": g for n, g in load_file(paths["grads.safetensors"]).items()})
    return out


def torch_pass(c, state, ids, targets, mode):
    """Logits, loss and gradients of PyTorch: `mode` "autocast", "nearest",
    "truncate" (float32 with bf16 operands) or "float64"."""
    model = TransformerLM(c)
    if mode == "float64":
        model = model.double()
    model.load_state_dict({k: v.to(next(model.parameters()).dtype) for k, v in state.items()})
    ids, targets = torch.from_numpy(ids), torch.from_numpy(targets).reshape(-1)
    if mode == "autocast":
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = model(ids)
    elif mode in ("nearest", "truncate"):
        with Bf16Operands(mode == "truncate"):
            logits = model(ids)
    else:
        logits = model(ids)
    loss = F.cross_entropy(logits.float().reshape(-1, c["vocab_size"]), targets)
    loss.backward()
    out = {"loss": loss.detach().float(), "logits": logits.detach().float()}
    out.update({f"grad {n}": p.grad.float() for n, p in model.named_parameters()})
    return out


def slope(got, want):
    got, want = got.double().flatten(), want.double().flatten()
    return (got @ want / (want @ want)).item()


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    p.add_argument("--config", help="model config JSON (default: the benchmark model of tinylm bench)")
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--tinylm", default=os.path.join(root, "target", "release", "tinylm"))
    p.add_argument("--tolerance-logits", type=float, default=2e-2)
    p.add_argument("--tolerance-grads", type=float, default=5e-2)
    p.add_argument("--tolerance-slope", type=float, default=2e-3)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    from safetensors.torch import save_file

    c = load_config(args.config)
    torch.manual_seed(args.seed)
    model = TransformerLM(c)
    with torch.no_grad():  # gains away from 1 so their gradients are exercised
        for q in model.parameters():
            if q.dim() == 1:
                q.add_(0.1 * torch.randn_like(q))
    state = {k: v.float().contiguous() for k, v in model.state_dict().items()}
    rng = np.random.default_rng(args.seed)
    b, t = args.batch_size, c["context_length"]
    ids = rng.integers(0, c["vocab_size"], size=(b, t), dtype=np.int64)
    targets = rng.integers(0, c["vocab_size"], size=(b, t), dtype=np.int64)
    candidates = {}
    with tempfile.TemporaryDirectory() as tmp:
        paths = {n: os.path.join(tmp, n) for n in
                 ["config.json", "w.safetensors", "ids.npy", "targets.npy", "logits.npy", "grads.safetensors"]}
        with open(paths["config.json"], "w") as f:
            json.dump(c, f)
        save_file(state, paths["w.safetensors"])
        np.save(paths["ids.npy"], ids)
        np.save(paths["targets.npy"], targets)
        for precision in ("fp32", "bf16"):
            candidates[f"tinylm {precision}"] = tinylm_forward(args, precision, paths)
    reference = torch_pass(c, state, ids, targets, "autocast")
    for mode in ("nearest", "truncate"):
        candidates[f"torch bf16 operands, {mode}"] = torch_pass(c, state, ids, targets, mode)
    truth = torch_pass(c, state, ids, targets, "float64")

    passed = {}
    for name, ours in candidates.items():
        errs = {k: max_rel_err(ours[k], reference[k]) for k in reference}
        grads = {k: v for k, v in errs.items() if k.startswith("grad")}
        worst = max(grads, key=grads.get)
        s = slope(ours["logits"], reference["logits"])
        ok = (errs["logits"] <= args.tolerance_logits and errs["loss"] <= args.tolerance_logits
              and grads[worst] <= args.tolerance_grads and abs(s - 1) <= args.tolerance_slope)
        passed[name] = ok
        print(json.dumps({"candidate": name, "against": "torch.autocast bf16", "passes": ok,
                          "loss": ours["loss"].item(), "loss_err": errs["loss"], "logits_err": errs["logits"],
                          "logits_slope": s, "max_grad_err": grads[worst], "worst_grad": worst,
                          "logits_err_vs_float64": max_rel_err(ours["logits"], truth["logits"]),
                          "tensors": len(errs)}))
    s = slope(reference["logits"], truth["logits"])
    print(json.dumps({"candidate": "torch.autocast bf16", "against": "float64", "logits_slope": s,
                      "logits_err": max_rel_err(reference["logits"], truth["logits"])}))
    if not passed["tinylm bf16"]:
        sys.exit("tinylm bf16 is outside the tolerances of PyTorch's autocast")
    if passed["torch bf16 operands, truncate"]:
        sys.exit("the check does not tell truncation from rounding to nearest")


if __name__ == "__main__":
    main()
