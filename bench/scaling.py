"""Projected data-parallel efficiency of `tinylm train` over many ranks: the cost
model of docs/distributed.md, as Markdown tables. Python 3 standard library only.

    python3 bench/scaling.py

Per optimizer step a rank computes forward and backward on its share of the batch,
then the ranks all-reduce the f32 gradient (4 bytes per parameter) once; nothing
overlaps the two. With a ring all-reduce over R ranks,

    all-reduce = 2(R-1)/R · bytes / bus bandwidth + 2(R-1) · latency · calls
    compute    = step FLOPs of the rank's share / the node's achieved FLOP/s
    efficiency = compute / (compute + all-reduce)

where `calls` is the number of MPI calls the gradient is cut into across machines
(pieces of 2²² values, crates/tinylm/src/distributed/mpi.rs) and 1 for NCCL. Step
FLOPs are `tinylm bench`'s count: 6 per matrix-product parameter per token plus
attention's QKᵀ and PV in full (3× forward), which is also `tinylm info`'s training
step. Every constant below is an assumption or a measurement, and says which.
"""

import argparse
import math

# Measured: `tinylm bench --preset tinystories --batch-size 8
# --threads 2` on a 2-core Intel Xeon (family 6, model 167, AVX-512): 300 GFLOP/s,
# 150 GFLOP/s per core.
CPU_GFLOPS_PER_CORE = 150.0
# Assumed: a CPU node of this many such cores, its throughput scaling linearly.
CPU_CORES = 32
# Assumed: achieved bf16 TFLOP/s of one H100-class GPU on these shapes.
GPU_TFLOPS = 400.0
# Networks between nodes: name, bus bandwidth in GB/s (the line rate, all of it:
# an assumption; TCP usually reaches 70-90% of it), latency per ring step in
# seconds (assumed: TCP over Ethernet, RDMA at 100 Gb/s).
NETWORKS = [
    ("10 Gb/s", 10 / 8, 30e-6),
    ("25 Gb/s", 25 / 8, 30e-6),
    ("100 Gb/s", 100 / 8, 5e-6),
]
# Assumed: NCCL's all-reduce bus bandwidth over NVLink on 8 H100-class GPUs, and
# its latency per ring step.
NVLINK = ("NVLink", 150.0, 5e-6)
# Values per MPI all-reduce call across machines (mpi.rs `CHUNK`).
MPI_CHUNK = 1 << 22
NODES = [2, 4, 8, 16, 32, 64]
TARGET = 0.9

# Model shapes (tinylm's `ModelConfig`): name, vocab, context, d_model, layers,
# d_ff, FFN matrices (SwiGLU 3, SiLU 2), tied embeddings.
MODELS = {
    "tinystories": ("TinyStories", 10_000, 256, 512, 4, 1344, 3, False),
    "gpt2": ("GPT-2 small", 50_257, 1024, 768, 12, 3072, 2, True),
    "gpt2-preset": ("gpt2-small preset", 50_257, 1024, 768, 12, 3072, 3, False),
}
# How to name each shape to tinylm.
FLAGS = {
    "tinystories": "the default model, `--preset tinystories`",
    "gpt2": "`--preset gpt2-small --tie-embeddings --ffn silu` (GPT-2's own shape)",
    "gpt2-preset": "`--preset gpt2-small` (SwiGLU, untied embeddings)",
}
# Sequences per rank per step in the efficiency tables: CPU nodes, GPUs.
SHARE = {
    "tinystories": (32, 128),
    "gpt2": (8, 32),
    "gpt2-preset": (8, 32),
}


def parameters(m):
    """Every parameter, as `tinylm info` counts them."""
    _, vocab, _, d, layers, f, ffn, tied = m
    per_layer = 4 * d * d + ffn * d * f + 2 * d
    return vocab * d * (1 if tied else 2) + layers * per_layer + d


def flops_per_sequence(m):
    """Training FLOPs of one sequence of the context length (`tinylm bench`'s count)."""
    _, vocab, t, d, layers, f, ffn, _ = m
    matmul_params = layers * (4 * d * d + ffn * d * f) + vocab * d
    return 6.0 * matmul_params * t + layers * 12.0 * t * t * d


def all_reduce_s(params, ranks, network, calls):
    _, gbps, latency = network
    steps = 2 * (ranks - 1)
    return steps / ranks * params * 4 / (gbps * 1e9) + steps * latency * calls


def pct(x):
    return f"{100 * x:.0f}%"


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cpu-cores", type=int, default=CPU_CORES, help="cores per CPU node")
    p.add_argument("--gflops-per-core", type=float, default=CPU_GFLOPS_PER_CORE)
    p.add_argument("--gpu-tflops", type=float, default=GPU_TFLOPS)
    a = p.parse_args()
    cpu_flops = a.cpu_cores * a.gflops_per_core * 1e9
    gpu_flops = a.gpu_tflops * 1e12

    print(f"CPU node: {a.cpu_cores} cores x {a.gflops_per_core:.0f} GFLOP/s = "
          f"{cpu_flops * 1e-12:.1f} TFLOP/s; GPU: {a.gpu_tflops:.0f} TFLOP/s\n")
    print("| model | tinylm flags | parameters | f32 gradient | training FLOPs per sequence |")
    print("| --- | --- | ---: | ---: | ---: |")
    for key, m in MODELS.items():
        n = parameters(m)
        print(f"| {m[0]} | {FLAGS[key]} | {n:,} | {n * 4 / 1e6:.1f} MB | "
              f"{flops_per_sequence(m) / 1e9:,.1f} GFLOP ({m[2]} tokens) |")

    print(f"\nEfficiency, CPU nodes ({a.cpu_cores} cores), each rank's share of the batch fixed:\n")
    print("| model | per rank | compute | network | " + " | ".join(f"{r} nodes" for r in NODES) + " |")
    print("| --- | --- | ---: | --- | " + " | ".join("---:" for _ in NODES) + " |")
    for key, m in MODELS.items():
        seqs = SHARE[key][0]
        compute = seqs * flops_per_sequence(m) / cpu_flops
        n = parameters(m)
        calls = math.ceil(n / MPI_CHUNK)
        for net in NETWORKS:
            cells = [pct(compute / (compute + all_reduce_s(n, r, net, calls))) for r in NODES]
            print(f"| {m[0]} | {seqs} x {m[2]} | {compute * 1e3:,.0f} ms | {net[0]} | " + " | ".join(cells) + " |")

    print("\nEfficiency, 8 GPUs in one machine over NVLink:\n")
    print(f"| model | per GPU | compute | all-reduce | efficiency | sequences per GPU for {pct(TARGET)} |")
    print("| --- | --- | ---: | ---: | ---: | ---: |")
    need = TARGET / (1 - TARGET)  # compute >= 9 x all-reduce
    for key, m in MODELS.items():
        seqs = SHARE[key][1]
        per_seq = flops_per_sequence(m) / gpu_flops
        compute = seqs * per_seq
        ar = all_reduce_s(parameters(m), 8, NVLINK, 1)
        print(f"| {m[0]} | {seqs} x {m[2]} | {compute * 1e3:.1f} ms | {ar * 1e3:.2f} ms | "
              f"{pct(compute / (compute + ar))} | {math.ceil(need * ar / per_seq)} |")

    print(f"\nSequences each CPU node needs per step for {pct(TARGET)} "
          "(the global batch_size is nodes x this):\n")
    print("| model | network | " + " | ".join(f"{r} nodes" for r in NODES) + " |")
    print("| --- | --- | " + " | ".join("---:" for _ in NODES) + " |")
    for m in MODELS.values():
        n = parameters(m)
        calls = math.ceil(n / MPI_CHUNK)
        per_seq = flops_per_sequence(m) / cpu_flops
        for net in NETWORKS:
            cells = [str(math.ceil(need * all_reduce_s(n, r, net, calls) / per_seq)) for r in NODES]
            print(f"| {m[0]} | {net[0]} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
