#!/usr/bin/env python3
"""bench/plot_sync.py — the sync strategies of parallel/sync/ side by side, as one SVG.

    python3 bench/plot_sync.py --trainer build/examples/train_gpt --out docs/img/beyond-sync-strategies.svg
                               [--steps 200] [--inner-steps 20] [--dp 4] [--json FILE] [-- TRAINER FLAGS...]

Runs train_gpt once per strategy on the same model, data and seed (--dp replicas, --pp/--fsdp/
--cp/--tp 1): DDP, async (staleness 1), local SGD, DiLoCo, Streaming DiLoCo (4 fragments,
overlap 1, alpha 0.5) and FedAvg (every client, rounds of H steps), validating every H steps
(--eval-every H: every sync of every fragment has landed there). Reads each run's
"step N  validation loss X" lines and its "sync S on dp: B all-reduce payload bytes per step"
line (rank 0's payload per step, the trainer's count checked against parallel/sync/traffic.hpp),
and writes one SVG of two panels: validation loss against the step, and against the all-reduce
payload bytes communicated so far (B x step, log scale). No dependencies: the SVG is written by
hand. --json FILE also writes the curves as JSON.
"""
import argparse
import json
import math
import re
import subprocess
import sys

STRATEGIES = [
    # name, colour, flags (H is filled in)
    ("DDP", "#1f77b4", ["--sync", "ddp"]),
    ("async s=1", "#9467bd", ["--sync", "async", "--staleness", "1"]),
    ("local SGD H={H}", "#2ca02c", ["--sync", "local-sgd", "--inner-steps", "{H}"]),
    ("DiLoCo H={H}", "#d62728", ["--sync", "diloco", "--inner-steps", "{H}"]),
    ("Streaming DiLoCo H={H} F=4 tau=1", "#ff7f0e",
     ["--sync", "diloco", "--inner-steps", "{H}", "--fragments", "4", "--overlap", "1", "--overlap-alpha", "0.5"]),
    ("FedAvg L={H}", "#8c564b", ["--sync", "fedavg", "--inner-steps", "{H}"]),
]


def run(trainer, flags):
    """The run's validation curve [(step, loss)] and its payload bytes per step."""
    out = subprocess.run([trainer] + flags, check=True, capture_output=True, text=True).stdout
    curve = [(int(s), float(l)) for s, l in re.findall(r"step +(\d+)  validation loss ([0-9.eE+-]+)", out)]
    m = re.search(r"sync \S+ on dp: (\d+) all-reduce payload bytes per step", out)
    if not curve or not m:
        sys.exit("plot_sync.py: no validation losses or payload line in the output of " + " ".join([trainer] + flags))
    return curve, float(m.group(1))


def nice_ticks(lo, hi, n=5):
    step = 10 ** math.floor(math.log10((hi - lo) / n)) if hi > lo else 1
    for m in (1, 2, 5, 10):
        if (hi - lo) / (step * m) <= n:
            step *= m
            break
    t = math.ceil(lo / step) * step
    ticks = []
    while t <= hi + 1e-12:
        ticks.append(t)
        t += step
    return ticks


def svg(curves, title):
    """Two panels (loss vs step, loss vs bytes on a log axis) and a legend, as SVG text."""
    W, H, pad_l, pad_r, pad_t, pad_b, gap = 980, 420, 64, 16, 40, 48, 70
    pw = (W - pad_l - pad_r - gap - 190) / 2  # the legend on the right
    ph = H - pad_t - pad_b
    losses = [l for c in curves for _, l in c["points"]]
    ylo, yhi = min(losses), max(losses)
    ylo, yhi = ylo - 0.05 * (yhi - ylo), yhi + 0.05 * (yhi - ylo)
    smax = max(s for c in curves for s, _ in c["points"])
    bytes_all = [b for c in curves for b in c["bytes"] if b > 0]
    blo, bhi = math.floor(math.log10(min(bytes_all))), math.ceil(math.log10(max(bytes_all)))
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="12">',
             f'<rect width="{W}" height="{H}" fill="white"/>',
             f'<text x="{W / 2}" y="20" text-anchor="middle" font-size="14">{title}</text>']

    def y_of(l):
        return pad_t + ph * (1 - (l - ylo) / (yhi - ylo))

    def panel(x0, xlabel, x_of, xticks, xtick_label, xs_of):
        parts.append(f'<rect x="{x0}" y="{pad_t}" width="{pw}" height="{ph}" fill="none" stroke="#444"/>')
        for t in nice_ticks(ylo, yhi):
            y = y_of(t)
            parts.append(f'<line x1="{x0}" y1="{y:.1f}" x2="{x0 + pw}" y2="{y:.1f}" stroke="#ddd"/>')
            parts.append(f'<text x="{x0 - 6}" y="{y + 4:.1f}" text-anchor="end">{t:g}</text>')
        for t in xticks:
            x = x0 + x_of(t)
            parts.append(f'<line x1="{x:.1f}" y1="{pad_t}" x2="{x:.1f}" y2="{pad_t + ph}" stroke="#ddd"/>')
            parts.append(f'<text x="{x:.1f}" y="{pad_t + ph + 16}" text-anchor="middle">{xtick_label(t)}</text>')
        parts.append(f'<text x="{x0 + pw / 2}" y="{H - 10}" text-anchor="middle">{xlabel}</text>')
        parts.append(f'<text transform="translate({x0 - 46},{pad_t + ph / 2}) rotate(-90)" text-anchor="middle">'
                     'validation loss</text>')
        for c in curves:
            pts = [(x0 + x_of(x), y_of(l)) for x, l in zip(xs_of(c), [l for _, l in c["points"]]) if x is not None]
            d = " ".join(f"{x:.1f},{y:.1f}" for x, y in pts)
            parts.append(f'<polyline points="{d}" fill="none" stroke="{c["colour"]}" stroke-width="1.8"/>')
            for x, y in pts:
                parts.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="2.2" fill="{c["colour"]}"/>')

    panel(pad_l, "step", lambda s: pw * s / smax, nice_ticks(0, smax), lambda t: f"{t:g}",
          lambda c: [s for s, _ in c["points"]])
    x1 = pad_l + pw + gap
    panel(x1, "all-reduce payload bytes so far (rank 0, log)", lambda b: pw * (math.log10(b) - blo) / (bhi - blo),
          [10 ** e for e in range(blo, bhi + 1)], lambda t: f"1e{round(math.log10(t))}",
          lambda c: [b if b > 0 else None for b in c["bytes"]])
    lx = x1 + pw + 20
    for i, c in enumerate(curves):
        y = pad_t + 10 + 20 * i
        parts.append(f'<line x1="{lx}" y1="{y}" x2="{lx + 22}" y2="{y}" stroke="{c["colour"]}" stroke-width="2.5"/>')
        parts.append(f'<text x="{lx + 28}" y="{y + 4}">{c["name"]}</text>')
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trainer", required=True)
    ap.add_argument("--out", required=True, help="the SVG to write")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--inner-steps", type=int, default=20)
    ap.add_argument("--dp", type=int, default=4)
    ap.add_argument("--json")
    ap.add_argument("extra", nargs="*", help="more trainer flags (after --)")
    a = ap.parse_args()
    if a.steps % a.inner_steps != 0:
        sys.exit("plot_sync.py: --steps must be a multiple of --inner-steps (the curves are read at the syncs)")
    base = ["--pp", "1", "--dp", str(a.dp), "--fsdp", "1", "--cp", "1", "--tp", "1", "--steps", str(a.steps),
            "--eval-every", str(a.inner_steps)] + a.extra
    curves = []
    for name, colour, flags in STRATEGIES:
        flags = [f.replace("{H}", str(a.inner_steps)) for f in flags]
        curve, per_step = run(a.trainer, base + flags)
        curves.append({"name": name.replace("{H}", str(a.inner_steps)), "colour": colour, "points": curve,
                       "payload_bytes_per_step": per_step, "bytes": [per_step * s for s, _ in curve]})
        print(f"{curves[-1]['name']:<36} final validation loss {curve[-1][1]:.4f}  "
              f"{per_step:.0f} B/step ({curves[0]['payload_bytes_per_step'] / per_step:.1f}x less than DDP)", flush=True)
    title = (f"train_gpt, dp {a.dp} replicas, {a.steps} steps {' '.join(a.extra)}: validation loss vs step and vs "
             "all-reduce bytes")
    with open(a.out, "w") as f:
        f.write(svg(curves, title))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(curves, f, indent=1)
    print("wrote " + a.out)


if __name__ == "__main__":
    main()
