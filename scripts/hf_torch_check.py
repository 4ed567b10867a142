#!/usr/bin/env python3
"""Cross-checks tests/data/hf/logits.safetensors (written by scripts/hf_fixtures.py's numpy twin)
with PyTorch: a second, independent float64 twin of Hugging Face's GPT2LMHeadModel and
LlamaForCausalLM forward, written with torch.nn.functional (F.layer_norm, F.linear,
F.scaled_dot_product_attention with is_causal, F.gelu(approximate="tanh") = HF's gelu_new,
F.silu, F.embedding) rather than the numpy twin's hand-written formulas. It loads the committed
fixture weights and asserts that its logits equal the committed golden logits within TOL
(absolute, float64). Prints the largest difference per model; exits non-zero on a mismatch.

  /tmp/venv32/bin/pip install numpy safetensors          # next to torch (CPU wheel)
  /tmp/venv32/bin/python scripts/hf_torch_check.py       # prints "PASS ..." or fails

transformers is not needed: the layer formulas follow modeling_gpt2.py / modeling_llama.py
(Conv1D stores [in, out] and computes x W + b; nn.Linear stores [out, in]; rotate_half RoPE with
inv_freq = theta^(-2i/d) over positions 0..T-1; repeat_kv maps KV head j to query heads
jG..jG+G-1; LlamaRMSNorm is weight * (x * rsqrt(mean(x^2) + eps)); GPT-2's lm_head is tied to wte).
"""
import json
import os
import sys

import torch
import torch.nn.functional as F
from safetensors.torch import load_file

HF = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "data", "hf")
# Both twins compute in float64 from the same F32 weights and differ only in the order of their
# sums (BLAS/torch kernels vs numpy): a genuine semantic slip (a transposed weight, the other
# RoPE half, a wrong GELU) moves logits by >1e-4 (exact erf GELU instead of gelu_new: 9e-4), eight orders of magnitude above this.
TOL = 1e-12


def load(name):
    return {k: v.to(torch.float64) for k, v in load_file(os.path.join(HF, name)).items()}


def gpt2_logits(W, c, ids):
    C, H = c["dim"], c["heads"]
    D, T = C // H, len(ids)
    x = F.embedding(ids, W["transformer.wte.weight"]) + W["transformer.wpe.weight"][:T]
    for l in range(c["layers"]):
        h = f"transformer.h.{l}."
        a = F.layer_norm(x, (C,), W[h + "ln_1.weight"], W[h + "ln_1.bias"], c["eps"])
        # Conv1D: weight [in, out] -> F.linear wants [out, in]
        qkv = F.linear(a, W[h + "attn.c_attn.weight"].T, W[h + "attn.c_attn.bias"])
        q, k, v = (t.view(T, H, D).transpose(0, 1) for t in qkv.split(C, dim=-1))
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(0, 1).reshape(T, C)
        x = x + F.linear(o, W[h + "attn.c_proj.weight"].T, W[h + "attn.c_proj.bias"])
        m = F.layer_norm(x, (C,), W[h + "ln_2.weight"], W[h + "ln_2.bias"], c["eps"])
        f = F.gelu(F.linear(m, W[h + "mlp.c_fc.weight"].T, W[h + "mlp.c_fc.bias"]), approximate="tanh")
        x = x + F.linear(f, W[h + "mlp.c_proj.weight"].T, W[h + "mlp.c_proj.bias"])
    x = F.layer_norm(x, (C,), W["transformer.ln_f.weight"], W["transformer.ln_f.bias"], c["eps"])
    return F.linear(x, W["transformer.wte.weight"])


def rms_norm(x, w, eps):  # LlamaRMSNorm
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def llama_logits(W, c, ids):
    C, H, K = c["dim"], c["heads"], c["kv_heads"]
    D, T, G = C // H, len(ids), H // K
    inv_freq = 1.0 / (c["theta"] ** (torch.arange(0, D, 2, dtype=torch.float64) / D))
    freqs = torch.outer(torch.arange(T, dtype=torch.float64), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos(), emb.sin()
    x = F.embedding(ids, W["model.embed_tokens.weight"])
    for l in range(c["layers"]):
        h = f"model.layers.{l}."
        a = rms_norm(x, W[h + "input_layernorm.weight"], c["eps"])
        q = F.linear(a, W[h + "self_attn.q_proj.weight"]).view(T, H, D).transpose(0, 1)
        k = F.linear(a, W[h + "self_attn.k_proj.weight"]).view(T, K, D).transpose(0, 1)
        v = F.linear(a, W[h + "self_attn.v_proj.weight"]).view(T, K, D).transpose(0, 1)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        # repeat_kv: [K, T, D] -> [K, G, T, D] -> [H, T, D]
        k = k[:, None].expand(K, G, T, D).reshape(H, T, D)
        v = v[:, None].expand(K, G, T, D).reshape(H, T, D)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(0, 1).reshape(T, C)
        x = x + F.linear(o, W[h + "self_attn.o_proj.weight"])
        m = rms_norm(x, W[h + "post_attention_layernorm.weight"], c["eps"])
        f = F.silu(F.linear(m, W[h + "mlp.gate_proj.weight"])) * F.linear(m, W[h + "mlp.up_proj.weight"])
        x = x + F.linear(f, W[h + "mlp.down_proj.weight"])
    x = rms_norm(x, W["model.norm.weight"], c["eps"])
    return F.linear(x, W["lm_head.weight"])


def main():
    torch.set_default_dtype(torch.float64)
    gold = load_file(os.path.join(HF, "logits.safetensors"))
    with open(os.path.join(HF, "logits.safetensors"), "rb") as f:  # configs live in the header's metadata
        n = int.from_bytes(f.read(8), "little")
        meta = json.loads(f.read(n))["__metadata__"]
    ids = gold["tokens"].to(torch.int64)
    llama = {}
    with open(os.path.join(HF, "llama_tiny.safetensors.index.json")) as f:
        for shard in sorted(set(json.load(f)["weight_map"].values())):
            llama.update(load(shard))
    ok = True
    for name, W, fn in (("gpt2", load("gpt2_tiny.safetensors"), gpt2_logits), ("llama", llama, llama_logits)):
        got = fn(W, json.loads(meta[name]), ids)
        want = gold[name]
        assert got.dtype == want.dtype == torch.float64 and got.shape == want.shape, (name, got.shape, want.shape)
        diff = (got - want).abs().max().item()
        print(f"{name}: logits {tuple(want.shape)}, max |torch - golden| = {diff:.3g} (tolerance {TOL:g})")
        ok &= diff <= TOL
    print(("PASS" if ok else "FAIL") + f": golden logits cross-checked with torch {torch.__version__}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
