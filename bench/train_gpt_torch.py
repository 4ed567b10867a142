#!/usr/bin/env python3
"""bench/train_gpt_torch.py — the PyTorch eager twin of examples/train_gpt.cpp (single process).

    python3 bench/train_gpt_torch.py --threads 1 --steps 60
    python3 bench/train_gpt_torch.py --threads 2 --layers 4 --dim 384 --steps 20
    python3 bench/train_gpt_torch.py --threads 1 --dtype bf16     # forward and loss under torch.autocast("cpu", bfloat16)
    python3 bench/train_gpt_torch.py --device cuda --layers 12 --dim 768 --heads 12 --seq 1024 --batch 8 --dtype bf16

Same text (the files under /usr/share/common-licenses, sorted, characters as the vocabulary, 90%
train), same batches (std::mt19937_64 from --seed, reimplemented below, start = rng() % (n - seq - 1)),
same model (models/gpt.hpp: token + position embeddings, pre-norm blocks with a fused qkv Linear and a
4x GELU-tanh MLP, final LayerNorm, lm_head without bias, no weight tying), same init law (N(0, 0.02),
block output projections N(0, 0.02 / sqrt(2 layers)), biases 0, norms 1 / 0), AdamW (lr 3e-3,
betas 0.9 / 0.95, eps 1e-8, weight decay 0.1 on weights and embeddings, not on biases and norms),
clipping to global norm 1. Attention is F.scaled_dot_product_attention(is_causal=True), what an
eager PyTorch user writes. Not part of the test suite: bench/compare_torch.py runs it against
train_gpt. The init values differ from dtensor's (another generator): the law is the same.

--dtype bf16 is what an eager PyTorch user writes for bf16 on a CPU: the forward and the loss under
torch.autocast("cpu", dtype=torch.bfloat16), the backward outside it. Autocast runs its
lower-precision ops in bf16 (here the Linears and scaled_dot_product_attention, through oneDNN:
AMX or AVX512-BF16 where the CPU has them) and keeps the rest in fp32 (LayerNorm, GELU, the
embeddings, cross entropy); parameters, gradients and AdamW stay fp32.
"""
import argparse
import contextlib
import math
import os
import sys
import time


class MT19937_64:
    """std::mt19937_64 (the C++ trainer's batch generator), default-seeded like the C++ one."""
    def __init__(self, seed):
        self.mt = [0] * 312
        self.mt[0] = seed & 0xFFFFFFFFFFFFFFFF
        for i in range(1, 312):
            self.mt[i] = (6364136223846793005 * (self.mt[i - 1] ^ (self.mt[i - 1] >> 62)) + i) & 0xFFFFFFFFFFFFFFFF
        self.index = 312

    def __call__(self):
        if self.index >= 312:
            mt = self.mt
            for i in range(312):
                x = (mt[i] & 0xFFFFFFFF80000000) | (mt[(i + 1) % 312] & 0x7FFFFFFF)
                xa = x >> 1
                if x & 1:
                    xa ^= 0xB5026F5AA96619E9
                mt[i] = mt[(i + 156) % 312] ^ xa
            self.index = 0
        y = self.mt[self.index]
        self.index += 1
        y ^= (y >> 29) & 0x5555555555555555
        y ^= (y << 17) & 0x71D67FFFEDA60000
        y ^= (y << 37) & 0xFFF7EEE000000000
        y ^= y >> 43
        return y


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=1, help="torch.set_num_threads")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--dtype", choices=["f32", "bf16"], default="f32",
                    help="bf16: the forward and the loss under torch.autocast('cpu', dtype=torch.bfloat16)")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                    help="cuda: the model, batches and optimizer on GPU 0 (bf16: torch.autocast('cuda', bfloat16))")
    ap.add_argument("--tf32", action="store_true", help="cuda: float matmuls on TF32 tensor cores (allow_tf32)")
    ap.add_argument("--skip", type=int, default=3, help="warm-up steps left out of the summary's tokens/s")
    ap.add_argument("--profile", action="store_true", help="torch.profiler over the steps after --skip: the per-op "
                    "table (self CPU time, sorted) on stdout after the summary (docs/benchmarks.md's per-op breakdown)")
    a = ap.parse_args()

    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)

    d = "/usr/share/common-licenses"
    text = b"".join(open(os.path.join(d, f), "rb").read() for f in sorted(os.listdir(d))
                    if os.path.isfile(os.path.join(d, f)))
    chars = sorted(set(text))
    index = {c: i for i, c in enumerate(chars)}
    split = len(text) * 9 // 10
    dev = torch.device(a.device)
    torch.backends.cuda.matmul.allow_tf32 = a.tf32
    train = torch.tensor([index[c] for c in text[:split]], dtype=torch.long, device=dev)

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(a.dim), nn.LayerNorm(a.dim)
            self.qkv, self.proj = nn.Linear(a.dim, 3 * a.dim), nn.Linear(a.dim, a.dim)
            self.fc1, self.fc2 = nn.Linear(a.dim, 4 * a.dim), nn.Linear(4 * a.dim, a.dim)

        def forward(self, x):
            B, T, C = x.shape
            hd = C // a.heads
            # qkv rows grouped by head (nn/attention.hpp): [B, T, H, 3, D]
            q, k, v = self.qkv(self.ln1(x)).view(B, T, a.heads, 3, hd).permute(3, 0, 2, 1, 4).unbind(0)
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.proj(y.transpose(1, 2).reshape(B, T, C))
            return x + self.fc2(F.gelu(self.fc1(self.ln2(x)), approximate="tanh"))

    class GPT(nn.Module):
        def __init__(self, vocab):
            super().__init__()
            self.wte, self.wpe = nn.Embedding(vocab, a.dim), nn.Embedding(a.seq, a.dim)
            self.h = nn.ModuleList(Block() for _ in range(a.layers))
            self.ln_f = nn.LayerNorm(a.dim)
            self.lm_head = nn.Linear(a.dim, vocab, bias=False)
            out_std = 0.02 / math.sqrt(2 * a.layers)
            for name, p in self.named_parameters():
                if name.endswith("bias"):
                    nn.init.zeros_(p)
                elif "ln" in name:
                    nn.init.ones_(p)
                else:
                    nn.init.normal_(p, 0, out_std if name.endswith(("proj.weight", "fc2.weight")) else 0.02)

        def forward(self, ids, tgt):
            x = self.wte(ids) + self.wpe(torch.arange(ids.shape[1], device=ids.device))
            for b in self.h:
                x = b(x)
            logits = self.lm_head(self.ln_f(x))
            return F.cross_entropy(logits.view(-1, logits.shape[-1]), tgt.view(-1))

    model = GPT(len(chars)).to(dev)
    nparams = sum(p.numel() for p in model.parameters())
    decay = [p for n, p in model.named_parameters() if not (n.endswith("bias") or "ln" in n)]
    no_decay = [p for n, p in model.named_parameters() if n.endswith("bias") or "ln" in n]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=a.lr, betas=(0.9, 0.95), eps=1e-8)
    print(f"train_gpt_torch: torch {torch.__version__}, {a.threads} thread(s), device {a.device}"
          f"{' (' + torch.cuda.get_device_name() + ')' if a.device == 'cuda' else ''}{', TF32' if a.tf32 else ''}; vocab {len(chars)}, "
          f"{a.layers} layers, dim {a.dim}, {a.heads} heads, seq {a.seq}, batch {a.batch}; {nparams} parameters; "
          f"dtype {a.dtype}{' (torch.autocast)' if a.dtype == 'bf16' else ''}")
    autocast = (lambda: torch.autocast(a.device, dtype=torch.bfloat16)) if a.dtype == "bf16" else contextlib.nullcontext
    rng = MT19937_64(a.seed)
    offsets = torch.arange(a.seq, device=dev)
    elapsed, counted = 0.0, 0
    prof = None
    for step in range(1, a.steps + 1):
        if a.profile and step == a.skip + 1:
            prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
            prof.__enter__()
        starts = torch.tensor([rng() % (len(train) - a.seq - 1) for _ in range(a.batch)], device=dev)
        ids = train[starts[:, None] + offsets]
        tgt = train[starts[:, None] + offsets + 1]
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=False)
        with autocast():
            loss = model(ids, tgt)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if a.device == "cuda":
            torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        if step > a.skip:
            elapsed += dt
            counted += 1
        print(f"step {step:4d}/{a.steps}  loss {loss.item():.4f}  {a.batch * a.seq / dt:8.0f} tokens/s")
        sys.stdout.flush()
    if prof is not None:
        prof.__exit__(None, None, None)
    print(f"\nsummary: {a.steps} steps; final train loss {loss.item():.4f}; "
          f"{a.batch * a.seq * counted / max(elapsed, 1e-9):.0f} tokens/s")
    if prof is not None:  # per step: divide the totals by the profiled steps
        print(f"profiled steps: {counted}")
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=30))


if __name__ == "__main__":
    main()
