"""The GPU's fused attention alone, on a GPU, beside PyTorch's: the forward
(`attention_forward_d{DP}` in crates/tinylm/src/kernels/cuda/attention.cu) and the
backward (`attention_backward_dq_d{DP}` then `attention_backward_dkv_d{DP}`).

Compiles the kernel family as tinylm does (common.cuh first, NVRTC, bf16 with
-DTINYLM_BF16) through CuPy, checks the forward's output and log-sum-exps and the
backward's dq, dk, dv against PyTorch in f32 (autograd through an explicit softmax
of the same inputs), and times each pass with CUDA events, median of `--repeat`
launches, on the CS336 TinyStories shape by default (B 128, H 16, T 256, D 32).
`--cu FILE` adds another version of attention.cu (same kernel arguments), compiled
with the common.cuh beside it if there is one (another commit's pair), else the
repository's; each
`--tile WARPS:KC[:MINBLOCKS]` runs every version with the forward's variant for the
head dimension instantiated with those warps and key chunk (and
`__launch_bounds__(32·WARPS, MINBLOCKS)`), each `--backward-tile WARPS:KC[:MINBLOCKS]`
likewise for both backward kernels. The anchor is PyTorch's fused causal attention
(`scaled_dot_product_attention`, flash), forward and backward; the floor of each pass
is the bytes it must move at the device's copy bandwidth, measured here.

    python bench/attention_gpu.py --tile 4:64:8 --backward-tile 4:32 --backward-tile 2:64
"""

import argparse
import json
import math
import os
import re
import statistics

import cupy
import numpy as np
import torch
import torch.nn.functional as F

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
KERNELS = os.path.join(ROOT, "crates", "tinylm", "src", "kernels", "cuda")


def tiles(name):
    """DP -> warps of attention.rs's `name` table (the launcher's one source)."""
    table = re.search(rf"const {name}: [^=]*= \[(.*?)\];", open(os.path.join(KERNELS, "attention.rs")).read())
    return {int(dp): int(warps) for dp, warps in re.findall(r"\((\d+), (\d+)\)", table.group(1))}


FORWARD, BACKWARD = tiles("FORWARD_TILES"), tiles("BACKWARD_TILES")


def cuda_include():
    for d in [os.environ.get("TINYLM_CUDA_INCLUDE"), "/usr/local/cuda/include"]:
        if d and os.path.exists(os.path.join(d, "cuda_bf16.h")):
            return d
    import nvidia

    for root in nvidia.__path__:
        d = os.path.join(root, "cu13", "include")
        if os.path.exists(os.path.join(d, "cuda_bf16.h")):
            return d
    raise SystemExit("no cuda_bf16.h: set TINYLM_CUDA_INCLUDE")


def with_tile(source, dp, tile, templates, kernels):
    """`source` with the DP variant of `templates` instantiated as WARPS:KC[:MINBLOCKS]
    and the launch bounds on `kernels`; the warps."""
    parts = [int(x) for x in tile.split(":")]
    warps, kc = parts[0], parts[1]
    for template in templates:
        source, n = re.subn(rf"{template}<{dp}, \d+, [^>]+>", f"{template}<{dp}, {warps}, {kc}>", source)
        assert n == 1, f"no instantiation of {template} for DP {dp}"
    if len(parts) == 3:
        for kernel in kernels:
            source = re.sub(rf"void (__launch_bounds__\([^)]*\)\s*)?{kernel}_d{dp}\(",
                            f"void __launch_bounds__({32 * warps}, {parts[2]}) {kernel}_d{dp}(", source)
    return source, warps


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--b", type=int, default=128)
    p.add_argument("--h", type=int, default=16)
    p.add_argument("--t", type=int, default=256)
    p.add_argument("--d", type=int, default=32)
    p.add_argument("--precision", default="bf16", choices=["bf16", "fp32"])
    p.add_argument("--tile", action="append", default=[], help="forward WARPS:KC[:MINBLOCKS] variants")
    p.add_argument("--backward-tile", action="append", default=[], help="backward WARPS:KC[:MINBLOCKS] variants")
    p.add_argument("--cu", action="append", default=[],
                   help="other versions of attention.cu (with the common.cuh beside each, if any)")
    p.add_argument("--repeat", type=int, default=50)
    a = p.parse_args()
    b, h, t, d = a.b, a.h, a.t, a.d
    c = h * d
    dp = next(x for x in sorted(FORWARD) if d <= x)
    bf16 = a.precision == "bf16"
    dtype = torch.bfloat16 if bf16 else torch.float32
    read = lambda path: open(path).read()
    common_of = lambda path: os.path.join(os.path.dirname(path), "common.cuh")
    own = os.path.join(KERNELS, "attention.cu")
    versions = []  # (name, source, its common.cuh, forward warps, backward warps)
    fwd = (["attention_forward_tile"], ["attention_forward"])
    bwd = (["attention_backward_dq_tile", "attention_backward_dkv_tile"],
           ["attention_backward_dq", "attention_backward_dkv"])
    for name, path in [("attention.cu", own)] + [(path, path) for path in a.cu]:
        source = read(path)
        common = read(common_of(path) if os.path.exists(common_of(path)) else common_of(own))
        versions.append((name, source, common, FORWARD[dp], BACKWARD[dp]))
        for tile in a.tile:
            src, warps = with_tile(source, dp, tile, *fwd)
            versions.append((f"{name} forward {tile}", src, common, warps, BACKWARD[dp]))
        for tile in a.backward_tile:
            src, warps = with_tile(source, dp, tile, *bwd)
            versions.append((f"{name} backward {tile}", src, common, FORWARD[dp], warps))
    options = ("--std=c++17", f"-I{cuda_include()}") + (("-DTINYLM_BF16",) if bf16 else ())

    torch.manual_seed(0)
    qkv = (torch.randn(b, t, 3 * c, device="cuda") * 1.5).to(dtype)
    dout = torch.randn(b, t, c, device="cuda").to(dtype)
    heads = lambda x: x.view(b, t, h, d).transpose(1, 2)
    q, k, v = (heads(x) for x in qkv.split(c, dim=2))
    qf, kf, vf = (x.float().requires_grad_() for x in (q, k, v))
    scale = 1.0 / math.sqrt(d)
    mask = torch.ones(t, t, dtype=torch.bool, device="cuda").triu(1)
    scores = ((qf @ kf.transpose(-1, -2)) * scale).masked_fill(mask, float("-inf"))
    want_lse = (torch.logsumexp(scores, dim=-1) / math.log(2)).detach()
    want_out = torch.softmax(scores, dim=-1) @ vf
    want_out.backward(heads(dout.float()))
    want_grads = [x.grad for x in (qf, kf, vf)]
    want_out = want_out.detach().transpose(1, 2).reshape(b, t, c)
    del scores

    def timed(launch):
        for _ in range(3):
            launch()
        times = []
        for _ in range(a.repeat):
            start, end = cupy.cuda.Event(), cupy.cuda.Event()
            start.record()
            launch()
            end.record()
            end.synchronize()
            times.append(cupy.cuda.get_elapsed_time(start, end) * 1e3)
        return statistics.median(times)

    # The copy bandwidth (bytes read + written), for the floors.
    src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    bandwidth = 2 * src.numel() / (timed(lambda: dst.copy_(src)) * 1e-6)
    del src, dst
    size = 2 if bf16 else 4
    rows = b * t * c * size  # one (B, T, C) tensor
    floor_fwd = (3 * rows + rows + 4 * b * h * t) / bandwidth * 1e6  # qkv, out, lse
    floor_bwd = (3 * rows + 2 * rows + 3 * rows + 2 * 4 * b * h * t) / bandwidth * 1e6  # qkv, dout, out, dqkv
    print(f"shape B {b} H {h} T {t} D {d} ({a.precision}); copy bandwidth {bandwidth / 1e12:.2f} TB/s; "
          f"floors: forward {floor_fwd:.1f} us, backward {floor_bwd:.1f} us", flush=True)

    out = torch.empty(b, t, c, dtype=dtype, device="cuda")
    lse = torch.empty(b, h, t, dtype=torch.float32, device="cuda")
    drow = torch.empty(b, h, t, dtype=torch.float32, device="cuda")
    dqkv = torch.empty(b, t, 3 * c, dtype=dtype, device="cuda")
    packed = np.int32(d % (16 // size) == 0)
    ptr = lambda x: np.uint64(x.data_ptr())
    ints = lambda *xs: tuple(np.int32(x) for x in xs)
    err = lambda got, want: ((got.float() - want).norm() / want.norm()).item()
    results = []
    for name, source, common, fwd_warps, bwd_warps in versions:
        try:
            module = cupy.RawModule(code="#line 1 \"common.cuh\"\n" + common + "\n#line 1 \"attention.cu\"\n" + source,
                                    options=options, backend="nvrtc")
            forward = module.get_function(f"attention_forward_d{dp}")
            dq, dkv = (module.get_function(f"attention_backward_{k}_d{dp}") for k in ("dq", "dkv"))
        except Exception as e:  # a variant that does not compile is reported, not fatal
            print(f"{name}: does not build: {str(e)[:400]}", flush=True)
            continue
        fwd_grid = (b * h, -(-t // (16 * fwd_warps)), 1)
        bwd_grid = (b * h, -(-t // (16 * bwd_warps)), 1)
        fwd_args = (ptr(out), ptr(lse), ptr(qkv)) + ints(t, t, 0, h, d) + (np.float32(scale), packed)
        dq_args = (ptr(dqkv), ptr(drow), ptr(dout), ptr(out), ptr(qkv), ptr(lse)) + ints(t, h, d) + (np.float32(scale), packed)
        dkv_args = (ptr(dqkv), ptr(dout), ptr(qkv), ptr(lse), ptr(drow)) + ints(t, h, d) + (np.float32(scale), packed)
        run_forward = lambda: forward(fwd_grid, (32 * fwd_warps, 1, 1), fwd_args)

        def run_backward():
            dq(bwd_grid, (32 * bwd_warps, 1, 1), dq_args)
            dkv(bwd_grid, (32 * bwd_warps, 1, 1), dkv_args)

        for x in (out, lse, dqkv):
            x.fill_(float("nan"))
        run_forward()
        run_backward()
        torch.cuda.synchronize()
        grads = [heads(x) for x in dqkv.split(c, dim=2)]
        row = {"version": name, "forward_us": round(timed(run_forward), 1),
               "backward_us": round(timed(run_backward), 1),
               "err_out": err(out, want_out), "err_lse": (lse - want_lse).abs().max().item(),
               "err_dq_dk_dv": [err(g, w) for g, w in zip(grads, want_grads)],
               "registers": [f.num_regs for f in (forward, dq, dkv)],
               "local_bytes": [f.local_size_bytes for f in (forward, dq, dkv)]}
        results.append(row)
        print(json.dumps(row), flush=True)
    qg, kg, vg = (x.detach().requires_grad_() for x in (q, k, v))
    y = F.scaled_dot_product_attention(qg, kg, vg, is_causal=True)
    dy = heads(dout)
    torch_fwd = timed(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True))
    torch_bwd = timed(lambda: torch.autograd.grad(y, (qg, kg, vg), dy, retain_graph=True))
    print(json.dumps({"version": "torch sdpa (causal)", "forward_us": round(torch_fwd, 1), "backward_us": round(torch_bwd, 1)}))
    print(f"{'version':<36} {'fwd us':>8} {'x floor':>7} {'bwd us':>8} {'x floor':>7} {'regs':>12} {'err out':>9} {'err dqkv':>9}")
    for r in results:
        print(f"{r['version']:<36} {r['forward_us']:>8} {r['forward_us'] / floor_fwd:>7.2f} {r['backward_us']:>8} "
              f"{r['backward_us'] / floor_bwd:>7.2f} {'/'.join(map(str, r['registers'])):>12} "
              f"{r['err_out']:>9.2e} {max(r['err_dq_dk_dv']):>9.2e}")
    print(f"{'torch sdpa (causal)':<36} {torch_fwd:>8.1f} {torch_fwd / floor_fwd:>7.2f} {torch_bwd:>8.1f} {torch_bwd / floor_bwd:>7.2f}")


if __name__ == "__main__":
    main()
