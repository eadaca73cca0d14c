"""The GPU's fused attention forward (`attention_forward_d{DP}` in
crates/tinylm/src/kernels/cuda/attention.cu) alone, on a GPU, beside PyTorch's.

Compiles the kernel family as tinylm does (common.cuh first, NVRTC, bf16 with
-DTINYLM_BF16) through CuPy, checks its probabilities and output against PyTorch
(f32 softmax of the bf16 inputs' scores), and times it with CUDA events, median of
`--repeat` launches, on the CS336 TinyStories shape by default (B 128, H 16, T 256,
D 32). `--cu FILE` adds another version of attention.cu (same kernel arguments);
each `--tile WARPS:KC` runs every version with the head dimension's variant
instantiated with those warps and key chunk (`--tile WARPS:KC:MINBLOCKS` adds
`__launch_bounds__(32·WARPS, MINBLOCKS)`). The anchor is PyTorch's
fused causal attention (`scaled_dot_product_attention`, flash), which keeps no
probabilities, and the floor the bytes the kernel must move (att written, qkv read,
out written) at the device's copy bandwidth, measured here.

    python bench/attention_gpu.py --tile 4:32 --tile 4:64 --tile 2:32:8
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
# DP -> warps, read from attention.rs's FORWARD_TILES (the launcher's one source).
WARPS = {
    int(dp): int(warps)
    for dp, warps in re.findall(
        r"\((\d+), (\d+)\)",
        re.search(r"const FORWARD_TILES: [^=]*= \[(.*?)\];",
                  open(os.path.join(KERNELS, "attention.rs")).read()).group(1))
}


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


def with_tile(source, dp, tile):
    """`source` with the DP variant instantiated as WARPS:KC[:MINBLOCKS]."""
    parts = [int(x) for x in tile.split(":")]
    warps, kc = parts[0], parts[1]
    source, n = re.subn(rf"attention_forward_tile<{dp}, \d+, \d+>", f"attention_forward_tile<{dp}, {warps}, {kc}>", source)
    assert n == 1, f"no instantiation of DP {dp}"
    if len(parts) == 3:
        source = source.replace(f"void attention_forward_d{dp}(", f"void __launch_bounds__({32 * warps}, {parts[2]}) attention_forward_d{dp}(")
    return source, warps


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--b", type=int, default=128)
    p.add_argument("--h", type=int, default=16)
    p.add_argument("--t", type=int, default=256)
    p.add_argument("--d", type=int, default=32)
    p.add_argument("--precision", default="bf16", choices=["bf16", "fp32"])
    p.add_argument("--tile", action="append", default=[], help="WARPS:KC[:MINBLOCKS] variants")
    p.add_argument("--cu", action="append", default=[], help="other versions of attention.cu")
    p.add_argument("--repeat", type=int, default=50)
    a = p.parse_args()
    b, h, t, d = a.b, a.h, a.t, a.d
    c = h * d
    dp = next(x for x in sorted(WARPS) if d <= x)
    bf16 = a.precision == "bf16"
    dtype = torch.bfloat16 if bf16 else torch.float32
    common = open(os.path.join(KERNELS, "common.cuh")).read()
    own = open(os.path.join(KERNELS, "attention.cu")).read()
    versions = []
    for path, source in [("attention.cu", own)] + [(path, open(path).read()) for path in a.cu]:
        name = os.path.basename(path)
        versions.append((name, source, WARPS[dp]))
        versions += [(f"{name} {tile}",) + with_tile(source, dp, tile) for tile in a.tile]
    options = ("--std=c++17", f"-I{cuda_include()}") + (("-DTINYLM_BF16",) if bf16 else ())

    torch.manual_seed(0)
    qkv = (torch.randn(b, t, 3 * c, device="cuda") * 1.5).to(dtype)
    q, k, v = (x.view(b, t, h, d).transpose(1, 2) for x in qkv.split(c, dim=2))
    scale = 1.0 / math.sqrt(d)
    scores = (q.float() @ k.float().transpose(-1, -2)) * scale
    mask = torch.ones(t, t, dtype=torch.bool, device="cuda").triu(1)
    want_att = torch.softmax(scores.masked_fill(mask, float("-inf")), dim=-1)
    want_out = (want_att.to(dtype).float() @ v.float()).transpose(1, 2).reshape(b, t, c)
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
        return statistics.median(times), min(times)

    # The copy bandwidth (bytes read + written), for the floor.
    src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    copy_us, _ = timed(lambda: dst.copy_(src))
    bandwidth = 2 * src.numel() / (copy_us * 1e-6)
    del src, dst
    size = 2 if bf16 else 4
    moved = (b * h * t * t + b * t * 3 * c + b * t * c) * size
    floor_us = moved / bandwidth * 1e6
    print(f"shape B {b} H {h} T {t} D {d} ({a.precision}); copy bandwidth {bandwidth / 1e12:.2f} TB/s; "
          f"{moved / 1e6:.0f} MB to move: floor {floor_us:.1f} us", flush=True)

    out = torch.empty(b, t, c, dtype=dtype, device="cuda")
    att = torch.empty(b, h, t, t, dtype=dtype, device="cuda")
    packed = int(d % (16 // size) == 0) | int(t % (16 // size) == 0) << 1
    rows = []
    for name, source, warps in versions:
        try:
            module = cupy.RawModule(code="#line 1 \"common.cuh\"\n" + common + "\n#line 1 \"attention.cu\"\n" + source,
                                    options=options, backend="nvrtc")
            kernel = module.get_function(f"attention_forward_d{dp}")
        except Exception as e:  # a variant that does not compile is reported, not fatal
            print(f"{name}: does not build: {str(e)[:400]}", flush=True)
            continue
        grid = (b * h, -(-t // (16 * warps)), 1)
        args = (np.uint64(out.data_ptr()), np.uint64(att.data_ptr()), np.uint64(qkv.data_ptr()),
                np.int32(t), np.int32(t), np.int32(0), np.int32(h), np.int32(d), np.float32(scale), np.int32(packed))
        launch = lambda: kernel(grid, (32 * warps, 1, 1), args)
        out.fill_(float("nan"))
        att.fill_(float("nan"))
        launch()
        torch.cuda.synchronize()
        err_att = ((att.float() - want_att).norm() / want_att.norm()).item()
        err_out = ((out.float() - want_out).norm() / want_out.norm()).item()
        median, best = timed(launch)
        rows.append({"version": name, "median_us": round(median, 1), "best_us": round(best, 1),
                     "vs_floor": round(median / floor_us, 2), "err_att": err_att, "err_out": err_out,
                     "registers": kernel.num_regs, "local_bytes": kernel.local_size_bytes,
                     "shared_bytes": kernel.shared_size_bytes})
        print(json.dumps(rows[-1]), flush=True)
    flash_us, _ = timed(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True))
    print(json.dumps({"version": "torch sdpa (causal, keeps no probabilities)", "median_us": round(flash_us, 1)}))
    print(f"{'version':<40} {'median us':>10} {'x floor':>8} {'regs':>5} {'err att':>9} {'err out':>9}")
    for r in rows:
        print(f"{r['version']:<40} {r['median_us']:>10} {r['vs_floor']:>8} {r['registers']:>5} "
              f"{r['err_att']:>9.2e} {r['err_out']:>9.2e}")
    print(f"{'torch sdpa (no P kept)':<40} {flash_us:>10.1f}")


if __name__ == "__main__":
    main()
