"""PyTorch DTensor's redistribution on this machine, for docs/benchmarks.md's comparison.

    pip install torch --index-url https://download.pytorch.org/whl/cpu
    python3 bench/bench_redistribute_torch.py [--ranks 4] [--repeats 20]

Spawns `--ranks` processes on 127.0.0.1 with the gloo backend (a 1-d mesh of all of them) and
times, per size (1, 16, 64 MiB: one rank's larger buffer, float32, as bench_redistribute_*):
  S0_to_R    Shard(0) -> Replicate    (an all-gather)
  S0_to_S1   Shard(0) -> Shard(1)     (an all-to-all)
  raw_all_gather  dist.all_gather_into_tensor on the same bytes (the raw collective)
and the time of a tiny DTensor op including dispatch (x + x on a [4, 4] Shard(0) DTensor).
Each figure is the median over --repeats iterations of the slowest rank (a barrier before,
an all-reduce of the times after). Prints one CSV line per figure on rank 0.
"""

import argparse
import os
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.device_mesh import init_device_mesh

try:
    from torch.distributed.tensor import DTensor, Replicate, Shard
except ImportError:  # torch < 2.4
    from torch.distributed._tensor import DTensor, Replicate, Shard


def timed(fn, repeats):
    """Median over `repeats` of the slowest rank's time of fn() (after one warm-up)."""
    fn()
    times = []
    for _ in range(repeats):
        dist.barrier()
        t0 = time.perf_counter()
        fn()
        dt = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
        dist.all_reduce(dt, op=dist.ReduceOp.MAX)
        times.append(dt.item())
    return statistics.median(times)


def worker(rank, n, repeats, port):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=n)
    mesh = init_device_mesh("cpu", (n,))
    rows_for = lambda elements: elements // 1024  # [rows, 1024]: even shards at these sizes
    out = []
    for mib in (1, 16, 64):
        elements = mib * (1 << 20) // 4
        # S0 -> R: the gathered tensor is `elements`; S0 -> S1: one rank's piece is.
        full = torch.ones(rows_for(elements), 1024)
        x = DTensor.from_local(full.chunk(n, 0)[rank].contiguous(), mesh, [Shard(0)])
        t = timed(lambda: x.redistribute(mesh, [Replicate()]).to_local(), repeats)
        out.append(("S0_to_R", mib, t))
        send = full.chunk(n, 0)[rank].contiguous()
        recv = torch.empty_like(full)
        t = timed(lambda: dist.all_gather_into_tensor(recv, send), repeats)
        out.append(("raw_all_gather", mib, t))
        big = torch.ones(rows_for(elements * n), 1024)
        y = DTensor.from_local(big.chunk(n, 0)[rank].contiguous(), mesh, [Shard(0)])
        t = timed(lambda: y.redistribute(mesh, [Shard(1)]).to_local(), repeats)
        out.append(("S0_to_S1", mib, t))
        a2a_send = big.chunk(n, 0)[rank].contiguous().view(-1)
        a2a_recv = torch.empty_like(a2a_send)
        t = timed(lambda: dist.all_to_all_single(a2a_recv, a2a_send), repeats)
        out.append(("raw_all_to_all", mib, t))
    tiny = DTensor.from_local(torch.ones(4 // n if n <= 4 else 1, 4), mesh, [Shard(0)])
    t = timed(lambda: (tiny + tiny).to_local(), max(repeats, 200))
    out.append(("tiny_add", 0, t))
    if rank == 0:
        print(f"# torch {torch.__version__}, gloo, {n} processes on 127.0.0.1")
        print("what,MiB,median_us")
        for what, mib, t in out:
            print(f"{what},{mib},{t * 1e6:.1f}")
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--port", type=int, default=29517)
    args = p.parse_args()
    mp.spawn(worker, args=(args.ranks, args.repeats, args.port), nprocs=args.ranks, join=True)


if __name__ == "__main__":
    main()
