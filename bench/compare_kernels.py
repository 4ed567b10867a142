#!/usr/bin/env python3
"""bench/compare_kernels.py — the host kernels against PyTorch's ops on the same shapes, one run.

    python3 bench/compare_kernels.py --bench build-rel/bench/bench_kernels_host

Runs bench_kernels_host (Google Benchmark, JSON, medians of 3 repetitions) and
bench_kernels_torch.py (1 thread), then prints a markdown table: time per call of PyTorch, of
dtensor on the baseline ISA and on the dispatched one, and torch / dtensor (above 1: dtensor faster).
Times are CPU time per call (Google Benchmark's cpu_time; time.process_time in the twin), which
a loaded machine disturbs less than wall-clock time (both sides run one thread).
"""
import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bench", default="build-rel/bench/bench_kernels_host")
    a = ap.parse_args()
    load = os.getloadavg()
    r = subprocess.run([a.bench, "--benchmark_format=json", "--benchmark_repetitions=3",
                        "--benchmark_report_aggregates_only=true"], capture_output=True, text=True, check=True)
    dt = {}
    isa = "?"
    for b in json.loads(r.stdout)["benchmarks"]:
        if b.get("aggregate_name") != "median":
            continue
        name = b["run_name"][len("BM_"):]  # kernel/isa/args.../process_time
        kernel, flag, *args = name.split("/")
        args = [x for x in args if x.isdigit()]  # MeasureProcessCPUTime appends "process_time" to the name
        dt[("/".join([kernel] + args), int(flag))] = b["cpu_time"] * {"ns": 1, "us": 1e3, "ms": 1e6}[b["time_unit"]]
        if int(flag) == 1 and b.get("label"):
            isa = b["label"]
    pt = json.loads(subprocess.run([sys.executable, os.path.join(HERE, "bench_kernels_torch.py")], capture_output=True,
                                   text=True, check=True).stdout)
    print("load average at the start: %.2f %.2f %.2f, at the end: %.2f %.2f %.2f" % (load + os.getloadavg()))
    print(f"| kernel (shape) | PyTorch µs | dtensor baseline µs | dtensor {isa} µs | PyTorch / dtensor |")
    print("|---|---:|---:|---:|---:|")
    for name, torch_ns in pt.items():
        base, best = dt.get((name, 0)), dt.get((name, 1))
        if best is None:
            continue
        base_us = "—" if base is None else f"{base / 1e3:,.1f}"  # linear: the BLAS, no ISA variant
        print(f"| {name} | {torch_ns / 1e3:,.1f} | {base_us} | {best / 1e3:,.1f} | {torch_ns / best:.2f} |")


if __name__ == "__main__":
    main()
