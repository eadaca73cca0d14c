"""Compares training runs from their JSONL logs (tinylm's `log.jsonl` format): prints a
table (steps, wall-clock, training tokens/s, final validation loss, time to reach a
common validation loss) and draws every run's loss curves on one SVG, against steps
and against wall-clock. No plotting library needed.

    python bench/train_compare.py --plot out.svg NAME=DIR/log.jsonl[:VAL_LOSS_ALL] ...

The common target is the highest last validation loss of the runs (every run reaches
it); a run's time to the target is interpolated linearly between its evaluations.
`VAL_LOSS_ALL`, when given, is the validation loss over all windows at the end.
"""

import argparse
import json
import math

COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e"]


def read_log(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def train_seconds(records):
    """Seconds spent in training steps (evaluation excluded), from the per-window rates."""
    total, prev = 0.0, 0
    for r in records:
        total += (r["tokens"] - prev) / r["tokens_per_s"]
        prev = r["tokens"]
    return total


def time_to(records, target):
    """Wall-clock at which the validation loss first reaches `target` (interpolated)."""
    evals = [(r["wallclock_s"], r["val_loss"]) for r in records if r["val_loss"] is not None]
    prev = (0.0, math.inf)
    for w, v in evals:
        if v <= target:
            if math.isinf(prev[1]):
                return w
            return prev[0] + (w - prev[0]) * (prev[1] - target) / (prev[1] - v)
        prev = (w, v)
    return math.nan


def nice_ticks(hi, lo=0.0):
    """Round tick values (1, 2 or 5 times a power of ten apart) covering [lo, hi]."""
    raw = (hi - lo) / 5
    step = min(m * 10 ** math.floor(math.log10(raw)) for m in (1, 2, 5, 10)
               if m * 10 ** math.floor(math.log10(raw)) >= raw)
    first = math.ceil(lo / step - 1e-9)
    return [round(k * step, 10) for k in range(first, math.floor(hi / step + 1e-9) + 1)]


def svg_plot(path, runs):
    """Two panels: loss vs step and loss vs wall-clock; training loss as thin lines,
    validation loss as thick lines with dots."""
    width, height, pad = 1200, 460, 60
    panel_w = (width - 3 * pad) / 2
    losses = [r["train_loss"] for _, recs in runs for r in recs]
    losses += [r["val_loss"] for _, recs in runs for r in recs if r["val_loss"] is not None]
    y_lo, y_hi = math.floor(min(losses) * 2) / 2, math.ceil(max(losses) * 2) / 2
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'font-family="sans-serif" font-size="12">', f'<rect width="{width}" height="{height}" fill="white"/>']
    for panel, (key, label) in enumerate([("step", "step"), ("wallclock_s", "wall-clock (s)")]):
        x0 = pad + panel * (panel_w + pad)
        x_hi = max(r[key] for _, recs in runs for r in recs)
        sx = lambda x: x0 + panel_w * x / x_hi
        sy = lambda y: pad + (height - 2 * pad) * (y_hi - y) / (y_hi - y_lo)
        out.append(f'<rect x="{x0}" y="{pad}" width="{panel_w}" height="{height - 2 * pad}" '
                   'fill="none" stroke="black"/>')
        for xv in nice_ticks(x_hi):
            out.append(f'<text x="{sx(xv):.1f}" y="{height - pad + 16}" text-anchor="middle">{xv:g}</text>')
        for yv in nice_ticks(y_hi, y_lo):
            out.append(f'<text x="{x0 - 6}" y="{sy(yv) + 4:.1f}" text-anchor="end">{yv:g}</text>')
            out.append(f'<line x1="{x0}" x2="{x0 + panel_w}" y1="{sy(yv):.1f}" y2="{sy(yv):.1f}" '
                       'stroke="#ddd"/>')
        out.append(f'<text x="{x0 + panel_w / 2}" y="{height - pad + 36}" text-anchor="middle">{label}</text>')
        out.append(f'<text x="{x0 + panel_w / 2}" y="{pad - 24}" text-anchor="middle" font-size="14">'
                   f'loss vs {label} (thin: training batch, thick: validation)</text>')
        for i, (name, recs) in enumerate(runs):
            color = COLORS[i % len(COLORS)]
            pts = " ".join(f"{sx(r[key]):.1f},{sy(r['train_loss']):.1f}" for r in recs)
            out.append(f'<polyline points="{pts}" fill="none" stroke="{color}" stroke-width="0.8" opacity="0.6"/>')
            evals = [r for r in recs if r["val_loss"] is not None]
            pts = " ".join(f"{sx(r[key]):.1f},{sy(r['val_loss']):.1f}" for r in evals)
            out.append(f'<polyline points="{pts}" fill="none" stroke="{color}" stroke-width="2.5"/>')
            out += [f'<circle cx="{sx(r[key]):.1f}" cy="{sy(r["val_loss"]):.1f}" r="3" fill="{color}"/>'
                    for r in evals]
            if panel == 1:
                y = pad + 16 + 18 * i
                out.append(f'<line x1="{x0 + panel_w - 170}" x2="{x0 + panel_w - 145}" y1="{y - 4}" y2="{y - 4}" '
                           f'stroke="{color}" stroke-width="2.5"/>')
                out.append(f'<text x="{x0 + panel_w - 140}" y="{y}">{name}</text>')
    out.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(out) + "\n")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs", nargs="+", help="NAME=PATH/log.jsonl[:VAL_LOSS_ALL]")
    p.add_argument("--plot", required=True, help="SVG to write")
    args = p.parse_args()
    runs, full_val = [], {}
    for spec in args.runs:
        name, rest = spec.split("=", 1)
        path, _, val = rest.partition(":")
        runs.append((name, read_log(path)))
        full_val[name] = float(val) if val else math.nan
    target = max(next(r["val_loss"] for r in reversed(recs) if r["val_loss"] is not None) for _, recs in runs)
    svg_plot(args.plot, runs)
    print(f"target validation loss (highest final of the runs, periodic evaluation windows): {target:.4f}")
    print(f"{'run':<16}{'steps':>7}{'wall-clock s':>14}{'train tok/s':>13}{'final val':>11}"
          f"{'val (all)':>11}{'s to target':>13}")
    times = {}
    for name, recs in runs:
        last = recs[-1]
        final = next(r["val_loss"] for r in reversed(recs) if r["val_loss"] is not None)
        times[name] = time_to(recs, target)
        print(f"{name:<16}{last['step']:>7}{last['wallclock_s']:>14.1f}{last['tokens'] / train_seconds(recs):>13.0f}"
              f"{final:>11.4f}{full_val[name]:>11.4f}{times[name]:>13.1f}")
    first, *others = [name for name, _ in runs]
    if others:
        best = min(others, key=lambda n: times[n])
        print(f"{best} (fastest of the others) takes {times[best] / times[first]:.2f}x the wall-clock of {first} "
              f"to reach validation loss {target:.4f}")
    print(f"plot: {args.plot}")


if __name__ == "__main__":
    main()
