#!/usr/bin/env python3
"""bench/compare_torch.py — train_gpt against its PyTorch eager twin, interleaved, as a ratio.

    python3 bench/compare_torch.py --trainer build-rel/examples/train_gpt            # all four configurations
    python3 bench/compare_torch.py --trainer build-rel/examples/train_gpt --rounds 3 --only default-1

Each round runs every configuration once with dtensor and once with PyTorch (alternating which
goes first), so load from other users of the machine hits both alike. A run's figure is the
median of its per-step tokens/s after --skip warm-up steps; a configuration's figure is the median
over rounds. Prints one table (markdown) with the ratio dtensor / PyTorch and the load average.
On a loaded machine wall-clock tokens/s mostly measures the load, so each run also reports
tokens per CPU-second: the CPU time (user + system, getrusage of the child) of the run minus
that of a 2-step run of the same configuration (start-up, data loading, first steps), over the
extra steps' tokens.
Configurations: the default model (2 layers, dim 128) and the GEMM-heavy one (4 layers, dim 384),
each as 1 rank vs 1 torch thread and 2 data-parallel ranks (threads backend) vs 2 torch threads.
"""
import argparse
import os
import resource
import re
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
STEP = re.compile(r"^step\s+(\d+)/\d+\s+loss\s+\S+\s+(\d+)\s+tokens/s")

CONFIGS = {  # name: (model flags, ranks, steps)
    "default-1": ([], 1, 60),
    "default-2": ([], 2, 60),
    "l4d384-1": (["--layers", "4", "--dim", "384"], 1, 12),
    "l4d384-2": (["--layers", "4", "--dim", "384"], 2, 12),
}


def per_step_median(out, skip):
    rates = [int(m.group(2)) for line in out.splitlines() if (m := STEP.match(line)) and int(m.group(1)) > skip]
    if not rates:
        sys.exit("no step lines in:\n" + out[-2000:])
    return statistics.median(rates)


def run(cmd, env=None):
    """(stdout, CPU seconds of the child)"""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if r.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({r.returncode}):\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return r.stdout, cpu


def with_steps(cmd, steps):
    i = cmd.index("--steps")
    return cmd[:i + 1] + [str(steps)] + cmd[i + 2:]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trainer", default="build-rel/examples/train_gpt")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--skip", type=int, default=3)
    ap.add_argument("--only", nargs="*", default=list(CONFIGS))
    ap.add_argument("--omp-passive", action="store_true",
                    help="run PyTorch with OMP_WAIT_POLICY=PASSIVE: on a machine loaded beyond its cores, OpenMP's "
                         "spinning threads otherwise collapse PyTorch's 2-thread runs")
    a = ap.parse_args()
    results = {name: ([], []) for name in a.only}
    cpu_results = {name: ([], []) for name in a.only}
    tokens_per_step = 16 * 64
    load_at_start = os.getloadavg()
    for rnd in range(a.rounds):
        for name in a.only:
            flags, ranks, steps = CONFIGS[name]
            dt_cmd = [a.trainer, "--dp", str(ranks), "--tp", "1", "--no-sp", "--steps", str(steps),
                      "--eval-every", "100000"] + flags
            pt_cmd = [sys.executable, os.path.join(HERE, "train_gpt_torch.py"), "--threads", str(ranks),
                      "--steps", str(steps)] + flags
            order = [("dtensor", dt_cmd), ("torch", pt_cmd)]
            if rnd % 2:
                order.reverse()
            for who, cmd in order:
                env = dict(os.environ, OMP_WAIT_POLICY="PASSIVE") if who == "torch" and a.omp_passive else None
                out, cpu = run(cmd, env)
                _, cpu_start = run(with_steps(cmd, 2), env)
                rate = per_step_median(out, a.skip)
                cpu_rate = tokens_per_step * (steps - 2) / max(cpu - cpu_start, 1e-9)
                side = 0 if who == "dtensor" else 1
                results[name][side].append(rate)
                cpu_results[name][side].append(cpu_rate)
                print(f"round {rnd + 1} {name:10s} {who:8s} {rate:8.0f} tokens/s (wall), {cpu_rate:8.0f} tokens/CPU-s",
                      file=sys.stderr)
    print("load average (1, 5, 15 min) at the start: %.2f %.2f %.2f, at the end: %.2f %.2f %.2f"
          % (load_at_start + os.getloadavg()))
    print("| configuration | PyTorch tokens/s | dtensor tokens/s | ratio (wall) | PyTorch tokens/CPU-s | "
          "dtensor tokens/CPU-s | ratio (CPU) |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name in a.only:
        d, p = statistics.median(results[name][0]), statistics.median(results[name][1])
        dc, pc = statistics.median(cpu_results[name][0]), statistics.median(cpu_results[name][1])
        print(f"| {name} | {p:,.0f} | {d:,.0f} | {d / p:.2f} | {pc:,.0f} | {dc:,.0f} | {dc / pc:.2f} |")


if __name__ == "__main__":
    main()
