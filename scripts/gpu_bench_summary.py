#!/usr/bin/env python3
"""Summarise the CUDA benchmarks' JSON (scripts/gpu-check.sh) as ratios against the raw backend.

    gpu_bench_summary.py OUT_DIR "GPU NAME"

Reads OUT_DIR/bench_gemm_cuda.json, bench_attention_cuda.json, bench_comm_cuda.json (Google
Benchmark's --benchmark_out) and prints, per size, both sides' figure and their ratio:
  GEMM       op / cuBLAS and kernel / cuBLAS (TFLOP/s; goal >= 0.95), float and bf16
  FP8 GEMM   cuBLASLt's FP8 and the quantizing FP8 GEMM / bf16 cuBLAS (goal >= 1.3), where the GPU has FP8
  attention  forward+backward TFLOP/s, fraction of the GPU's FP32 peak: the cuBLAS chunks / the fused
             kernels (causal), and both / a naive unmasked cuBLAS version (full)
  bf16 attn  forward+backward TFLOP/s, fraction of the GPU's dense bf16 peak: cuDNN's fused
             attention / the cuBLAS chunks, causal and full
  gather     redistribute Shard -> Replicate on cuda_threads vs one cudaMemcpy of the same bytes
A pair whose two sides are not both present is an error (exit 1): a comparison with one side
missing must not read as a result.
"""
import json
import os
import sys

# Dense FP32 (non-tensor-core) peaks, TFLOP/s, from NVIDIA's data sheets (SXM parts).
FP32_PEAK = {"H100": 67.0, "H200": 67.0, "A100": 19.5}
# Dense bf16 tensor-core peaks, TFLOP/s, same sheets.
BF16_PEAK = {"H100": 989.0, "H200": 989.0, "A100": 312.0}


def load(out, name):
    path = os.path.join(out, name + ".json")
    if not os.path.exists(path):
        return None
    with open(path) as f:
        rows = json.load(f)["benchmarks"]
    table = {}
    for r in rows:
        if r.get("run_type") == "aggregate":
            continue
        parts = r["name"].split("/")  # family/variant/size/manual_time
        table[(parts[0], parts[1], int(parts[2]))] = r
    return table


def tflops(r):
    return r["flops"] / 1e12


def main():
    out, gpu = sys.argv[1], sys.argv[2]
    peak = next((v for k, v in FP32_PEAK.items() if k in gpu), None)
    bad = []

    gemm = load(out, "bench_gemm_cuda")
    if gemm is not None:
        print("GEMM n x n x n, TFLOP/s (op = ops::matmul on a 1-rank DTensor; kernel = kernels::cuda::matmul_into):")
        for prec in ("f32", "bf16"):
            for n in sorted({k[2] for k in gemm if k[0] == prec}):
                sides = {v: gemm.get((prec, v, n)) for v in ("op", "dtensor", "cublas")}
                if any(s is None for s in sides.values()):
                    bad.append(f"GEMM {prec} n={n}: a side is missing")
                    continue
                c = tflops(sides["cublas"])
                print(f"  {prec:4} n={n:5}: op {tflops(sides['op']):7.1f}  kernel {tflops(sides['dtensor']):7.1f}"
                      f"  cuBLAS {c:7.1f}  op/cuBLAS {tflops(sides['op']) / c:.3f}"
                      f"  kernel/cuBLAS {tflops(sides['dtensor']) / c:.3f}")
        fp8_sizes = sorted({k[2] for k in gemm if k[0] == "fp8"})
        if fp8_sizes:
            print("FP8 GEMM n x n x n, TFLOP/s (cuBLASLt E4M3 x E4M3 -> bf16; quantizing = from bf16 operands,"
                  " both casts included) against bf16 cuBLAS (goal: >= 1.3x):")
        for n in fp8_sizes:
            lt, qz, bf = gemm.get(("fp8", "cublaslt", n)), gemm.get(("fp8", "quantizing", n)), gemm.get(("bf16", "cublas", n))
            if lt is None or qz is None or bf is None:
                bad.append(f"FP8 GEMM n={n}: a side is missing")
                continue
            b = tflops(bf)
            print(f"  fp8  n={n:5}: cuBLASLt {tflops(lt):7.1f}  quantizing {tflops(qz):7.1f}  bf16 cuBLAS {b:7.1f}"
                  f"  fp8/bf16 {tflops(lt) / b:.3f}  quantizing/bf16 {tflops(qz) / b:.3f}")
    att = load(out, "bench_attention_cuda")
    if att is not None:
        print(f"attention fwd+bwd, batch 4 x 12 heads x head dim 64, float; TFLOP/s"
              f" (fraction of the {gpu} FP32 peak {peak} TFLOP/s); fused = attention_fused.cuh,"
              f" gemm = attention_gemm.cuh (tf32: TF32 allowed), naive = unmasked bmm + softmax:")
        frac = lambda r: f" ({tflops(r) / peak:.3f})" if peak else ""
        for n in sorted({k[2] for k in att}):
            get = lambda v: att.get(("f32", v, n))
            fc, gc, tc = get("fused_causal"), get("gemm_causal"), att.get(("tf32", "gemm_causal", n))
            ff, gf, nv = get("fused_full"), get("gemm_full"), get("naive_full")
            line = f"  T={n:5}:"
            if fc is not None or gc is not None:
                if fc is None or gc is None:
                    bad.append(f"attention causal T={n}: a side is missing")
                    continue
                line += (f" causal fused {tflops(fc):6.2f}{frac(fc)} gemm {tflops(gc):6.2f}{frac(gc)}"
                         f"{f' tf32 {tflops(tc):6.2f}' if tc is not None else ''}"
                         f" gemm/fused {tflops(gc) / tflops(fc):.3f}")
            if nv is not None or ff is not None or gf is not None:
                if nv is None or ff is None or gf is None:
                    bad.append(f"attention full T={n}: a side is missing")
                    continue
                line += (f" | full fused {tflops(ff):6.2f} gemm {tflops(gf):6.2f} naive cuBLAS {tflops(nv):6.2f}"
                         f" fused/naive {tflops(ff) / tflops(nv):.3f} gemm/naive {tflops(gf) / tflops(nv):.3f}")
            print(line)
    if att is not None and any(k[0] == "bf16" for k in att):
        bpeak = next((v for k, v in BF16_PEAK.items() if k in gpu), None)
        bfrac = lambda r: f" ({tflops(r) / bpeak:.3f})" if bpeak else ""
        print(f"attention fwd+bwd, batch 4 x 12 heads x head dim 64, bf16; TFLOP/s (fraction of the {gpu} dense"
              f" bf16 peak {bpeak} TFLOP/s); cudnn = attention_cudnn.cuh, gemm = attention_gemm.cuh:")
        for n in sorted({k[2] for k in att if k[0] == "bf16"}):
            line = f"  T={n:5}:"
            for mask in ("causal", "full"):
                c, g = att.get(("bf16", "cudnn_" + mask, n)), att.get(("bf16", "gemm_" + mask, n))
                if c is None or g is None or "error_message" in c:
                    bad.append(f"bf16 attention {mask} T={n}: a side is missing"
                               f"{' (' + c['error_message'] + ')' if c is not None and 'error_message' in c else ''}")
                    continue
                line += (f" {mask} cudnn {tflops(c):7.2f}{bfrac(c)} gemm {tflops(g):6.2f}{bfrac(g)}"
                         f" cudnn/gemm {tflops(c) / tflops(g):.2f} |")
            print(line)
    comm = load(out, "bench_comm_cuda")
    if comm is not None:
        print("all-gather on cuda_threads (rows x 1024 floats), GB/s: redistribute vs one cudaMemcpy of the same bytes:")
        for n in sorted({k[2] for k in comm if k[0] == "gather"}):
            d, m = comm.get(("gather", "dtensor", n)), comm.get(("gather", "memcpy", n))
            if d is None or m is None:
                bad.append(f"gather rows={n}: a side is missing")
                continue
            print(f"  rows={n:6}: dtensor {d['bytes_per_second'] / 1e9:8.1f}  memcpy {m['bytes_per_second'] / 1e9:8.1f}"
                  f"  ratio {d['bytes_per_second'] / m['bytes_per_second']:.3f}")
    for b in bad:
        print("FAIL:", b)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
