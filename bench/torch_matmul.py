"""PyTorch's bf16 matrix products on the CPU (oneDNN where it takes them) on the
products `tinylm bench-matmul` timed: reads that report, times `torch.matmul` on
bf16 tensors of the same shapes and transposes (the products of a step under
`torch.autocast("cpu", dtype=torch.bfloat16)`: bf16 operands, f32 sums, bf16
output), and prints one JSON line per product with its best GFLOP/s.

    python bench/torch_matmul.py REPORT --threads 2 --repeat 10
"""

import argparse
import json
import re
import time

import torch

# A row of the report: name, (m x k x n), count per step, f32 and bf16 GFLOP/s.
ROW = re.compile(r"^  (\S+\s+\S+)\s+\(\s*(\d+) x\s+(\d+) x\s+(\d+)\)\s+(\d+)\s")


def products(report):
    """(name, m, k, n, per_step) of each product in a `tinylm bench-matmul` report."""
    rows = []
    for line in open(report, encoding="utf-8"):
        match = ROW.match(line)
        if match:
            name = " ".join(match.group(1).split())
            rows.append((name, *(int(match.group(i)) for i in range(2, 6))))
    if not rows:
        raise SystemExit(f"{report}: no products found (not a `tinylm bench-matmul` report?)")
    return rows


def operands(name, m, k, n):
    """The product's operands as a step holds them, and the product as a function:
    `x·Wᵀ` with W (n, k), `dy·W` with W (k, n), `dyᵀ·x` with dy (k, m)."""
    randn = lambda *shape: torch.randn(*shape).to(torch.bfloat16)
    out = torch.empty(m, n, dtype=torch.bfloat16)
    if name.endswith("x·Wᵀ"):
        a, b = randn(m, k), randn(n, k)
        return lambda: torch.matmul(a, b.t(), out=out)
    if name.endswith("dy·W"):
        a, b = randn(m, k), randn(k, n)
        return lambda: torch.matmul(a, b, out=out)
    if name.endswith("dyᵀ·x"):
        a, b = randn(k, m), randn(k, n)
        return lambda: torch.matmul(a.t(), b, out=out)
    raise SystemExit(f"unknown product form in '{name}'")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("report", help="the output of `tinylm bench-matmul`")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=10, help="timed calls per product (best)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    for name, m, k, n, per_step in products(args.report):
        product = operands(name, m, k, n)
        product()  # warm-up: oneDNN builds its kernel for the shape
        best = float("inf")
        for _ in range(args.repeat):
            start = time.perf_counter()
            product()
            best = min(best, time.perf_counter() - start)
        gflops = 2 * m * k * n / best * 1e-9
        print(json.dumps(dict(name=name, m=m, k=k, n=n, per_step=per_step, gflops=gflops)))


if __name__ == "__main__":
    main()
