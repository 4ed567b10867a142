#!/usr/bin/env python3
"""bench/bench_kernels_torch.py — PyTorch's eager ops on the shapes of bench/bench_kernels_host.cpp.

    python3 bench/bench_kernels_torch.py [--threads 1] [--repeat 3]     # prints JSON: name -> ns per call

Names as the C++ benchmark's without the ISA argument (layer_norm/128, gelu/384, softmax/4,
attention/4/128, adamw/427008, linear/384/1152); each is forward + backward where the C++ one is (autograd,
as eager training runs it), the median of --repeat timings of a loop of about 0.3 s, in CPU time
(time.process_time: the machine is shared; one thread).
"""
import argparse
import json
import statistics
import time


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    import torch
    import torch.nn.functional as F
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)

    def timed(fn):
        fn()
        n, t = 1, 0.0
        while True:  # calibrate to ~0.3 s
            t0 = time.process_time()
            for _ in range(n):
                fn()
            t = time.process_time() - t0
            if t > 0.1:
                break
            n *= 4
        n = max(1, int(n * 0.3 / t))
        runs = []
        for _ in range(a.repeat):
            t0 = time.process_time()
            for _ in range(n):
                fn()
            runs.append((time.process_time() - t0) / n * 1e9)
        return statistics.median(runs)

    out = {}
    for dim in (128, 384):
        x = torch.randn(16, 64, dim, requires_grad=True)
        w, b = torch.ones(dim, requires_grad=True), torch.zeros(dim, requires_grad=True)
        dy = torch.randn(16, 64, dim)
        out[f"layer_norm/{dim}"] = timed(lambda: F.layer_norm(x, (dim,), w, b, 1e-5).backward(dy))
        h = torch.randn(16, 64, 4 * dim, requires_grad=True)
        dh = torch.randn(16, 64, 4 * dim)
        out[f"gelu/{dim}"] = timed(lambda: F.gelu(h, approximate="tanh").backward(dh))
    s = torch.randn(16 * 4 * 64, 64)
    out["softmax/4"] = timed(lambda: torch.softmax(s, -1))
    for heads, dim in ((4, 128), (6, 384)):
        q, k, v = (torch.randn(16, heads, 64, dim // heads, requires_grad=True) for _ in range(3))
        do = torch.randn(16, heads, 64, dim // heads)
        out[f"attention/{heads}/{dim}"] = timed(
            lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True).backward(do))
    p = torch.nn.Parameter(torch.randn(427008))
    p.grad = torch.randn(427008)
    opt = torch.optim.AdamW([p], lr=3e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    out["adamw/427008"] = timed(opt.step)
    # A Linear's three GEMMs without bias (y = x W^T; backward: dx = dy W, dW = dy^T x), 1024 tokens.
    for d_in, d_out in ((128, 384), (128, 128), (128, 512), (512, 128), (384, 1152), (384, 384), (384, 1536), (1536, 384)):
        x = torch.randn(1024, d_in, requires_grad=True)
        w = torch.randn(d_out, d_in, requires_grad=True)
        dy = torch.randn(1024, d_out)
        out[f"linear/{d_in}/{d_out}"] = timed(lambda: F.linear(x, w).backward(dy))
    print(json.dumps(out))


if __name__ == "__main__":
    main()
