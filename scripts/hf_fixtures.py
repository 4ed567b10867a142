#!/usr/bin/env python3
"""Writes tests/data/hf/: tiny Hugging Face-layout GPT-2 and Llama checkpoints (safetensors, HF
tensor names and layouts) with fixed random weights, and the logits of a fixed token sequence
computed by an independent float64 twin of Hugging Face's GPT2LMHeadModel / LlamaForCausalLM
forward (the formulas of transformers' modeling_gpt2.py / modeling_llama.py, written here with
numpy). tests/unit/test_llama.cpp ("Hugging Face checkpoints") imports the checkpoints with
models::import_hf_safetensors and compares dtensor's logits with these (tolerance 1e-9).

  python3 -m venv /tmp/venv30 && /tmp/venv30/bin/pip install numpy
  /tmp/venv30/bin/python scripts/hf_fixtures.py            # rewrites tests/data/hf/*

numpy, not torch: torch's wheels (download.pytorch.org) were not reachable where this was
written; the twin follows transformers' code line by line (Conv1D as x W + b, rotate_half,
repeat_kv, gelu_new, RMSNorm in the order HF computes it). scripts/hf_torch_check.py checks the
written logits against a torch.nn.functional twin (agreement 4.3e-15; docs/checkpoint.md).
Weights are stored as F32 (as HF stores them), the logits as F64; the twin computes in float64
from the F32 values. The GPT-2 file has a longer position table (16 rows) than the model's
context (12) and no lm_head (tied to wte); the Llama checkpoint is sharded in two files with
model.safetensors.index.json, as HF shards large models.
"""
import json
import os
import struct
import sys

import numpy as np

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "data", "hf")
TOKENS = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3]

GPT2 = dict(vocab=29, n_positions=16, seq=12, dim=16, heads=4, layers=2, ffn=64, eps=1e-5)
LLAMA = dict(vocab=31, seq=12, dim=16, heads=4, kv_heads=2, layers=2, ffn=24, eps=1e-6, theta=10000.0)


def write_safetensors(path, tensors, metadata={"format": "pt"}):
    header, offset, blobs = {"__metadata__": metadata}, 0, []
    for name in sorted(tensors):
        a = tensors[name]
        dtype = {np.float32: "F32", np.float64: "F64"}[a.dtype.type]
        data = np.ascontiguousarray(a).astype("<" + a.dtype.str[1:]).tobytes()
        header[name] = {"dtype": dtype, "shape": list(a.shape), "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
        blobs.append(data)
    text = json.dumps(header, separators=(",", ":"))
    text += " " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text.encode())
        for b in blobs:
            f.write(b)


def layer_norm(x, w, b, eps):
    m = x.mean(-1, keepdims=True)
    v = ((x - m) ** 2).mean(-1, keepdims=True)
    return (x - m) / np.sqrt(v + eps) * w + b


def rms_norm(x, w, eps):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def gelu_new(x):
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x**3)))


def causal_attention(q, k, v):  # [H, T, D] each
    d = q.shape[-1]
    s = q @ k.transpose(0, 2, 1) / np.sqrt(d)
    t = s.shape[-1]
    s = np.where(np.tril(np.ones((t, t), bool)), s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    return (p / p.sum(-1, keepdims=True)) @ v


def gpt2_weights(rng, c):
    C, F, w = c["dim"], c["ffn"], {}
    n = lambda *s: rng.normal(0, 0.3, s).astype(np.float32)
    w["transformer.wte.weight"] = n(c["vocab"], C)
    w["transformer.wpe.weight"] = n(c["n_positions"], C)
    for l in range(c["layers"]):
        h = f"transformer.h.{l}."
        for ln in ("ln_1", "ln_2"):
            w[h + ln + ".weight"] = (1 + n(C)).astype(np.float32)
            w[h + ln + ".bias"] = n(C)
        w[h + "attn.c_attn.weight"], w[h + "attn.c_attn.bias"] = n(C, 3 * C), n(3 * C)  # Conv1D: [in, out]
        w[h + "attn.c_proj.weight"], w[h + "attn.c_proj.bias"] = n(C, C), n(C)
        w[h + "mlp.c_fc.weight"], w[h + "mlp.c_fc.bias"] = n(C, F), n(F)
        w[h + "mlp.c_proj.weight"], w[h + "mlp.c_proj.bias"] = n(F, C), n(C)
    w["transformer.ln_f.weight"], w["transformer.ln_f.bias"] = (1 + n(C)).astype(np.float32), n(C)
    return w


def gpt2_logits(w, c, ids):
    W = {k: v.astype(np.float64) for k, v in w.items()}
    C, H = c["dim"], c["heads"]
    D, T = C // H, len(ids)
    x = W["transformer.wte.weight"][ids] + W["transformer.wpe.weight"][:T]
    for l in range(c["layers"]):
        h = f"transformer.h.{l}."
        a = layer_norm(x, W[h + "ln_1.weight"], W[h + "ln_1.bias"], c["eps"])
        qkv = a @ W[h + "attn.c_attn.weight"] + W[h + "attn.c_attn.bias"]
        q, k, v = (qkv[:, i * C:(i + 1) * C].reshape(T, H, D).transpose(1, 0, 2) for i in range(3))
        o = causal_attention(q, k, v).transpose(1, 0, 2).reshape(T, C)
        x = x + o @ W[h + "attn.c_proj.weight"] + W[h + "attn.c_proj.bias"]
        m = layer_norm(x, W[h + "ln_2.weight"], W[h + "ln_2.bias"], c["eps"])
        x = x + gelu_new(m @ W[h + "mlp.c_fc.weight"] + W[h + "mlp.c_fc.bias"]) @ W[h + "mlp.c_proj.weight"] + W[h + "mlp.c_proj.bias"]
    x = layer_norm(x, W["transformer.ln_f.weight"], W["transformer.ln_f.bias"], c["eps"])
    return x @ W["transformer.wte.weight"].T  # lm_head tied to wte


def llama_weights(rng, c):
    C, F, H, K = c["dim"], c["ffn"], c["heads"], c["kv_heads"]
    D, w = C // H, {}
    n = lambda *s: rng.normal(0, 0.3, s).astype(np.float32)
    w["model.embed_tokens.weight"] = n(c["vocab"], C)
    for l in range(c["layers"]):
        h = f"model.layers.{l}."
        w[h + "input_layernorm.weight"] = (1 + n(C)).astype(np.float32)
        w[h + "post_attention_layernorm.weight"] = (1 + n(C)).astype(np.float32)
        w[h + "self_attn.q_proj.weight"] = n(H * D, C)  # nn.Linear: [out, in]
        w[h + "self_attn.k_proj.weight"] = n(K * D, C)
        w[h + "self_attn.v_proj.weight"] = n(K * D, C)
        w[h + "self_attn.o_proj.weight"] = n(C, C)
        w[h + "mlp.gate_proj.weight"] = n(F, C)
        w[h + "mlp.up_proj.weight"] = n(F, C)
        w[h + "mlp.down_proj.weight"] = n(C, F)
    w["model.norm.weight"] = (1 + n(C)).astype(np.float32)
    w["lm_head.weight"] = n(c["vocab"], C)
    return w


def rope(x, theta):  # [heads, T, D], HF's rotate_half layout
    d, t = x.shape[-1], x.shape[-2]
    inv = theta ** (-np.arange(0, d, 2, dtype=np.float64) / d)
    ang = np.outer(np.arange(t, dtype=np.float64), inv)
    cos, sin = np.cos(np.concatenate([ang, ang], -1)), np.sin(np.concatenate([ang, ang], -1))
    rot = np.concatenate([-x[..., d // 2:], x[..., : d // 2]], -1)
    return x * cos + rot * sin


def llama_logits(w, c, ids):
    W = {k: v.astype(np.float64) for k, v in w.items()}
    C, H, K = c["dim"], c["heads"], c["kv_heads"]
    D, T, G = C // H, len(ids), H // K
    silu = lambda z: z / (1 + np.exp(-z))
    x = W["model.embed_tokens.weight"][ids]
    for l in range(c["layers"]):
        h = f"model.layers.{l}."
        a = rms_norm(x, W[h + "input_layernorm.weight"], c["eps"])
        q = (a @ W[h + "self_attn.q_proj.weight"].T).reshape(T, H, D).transpose(1, 0, 2)
        k = (a @ W[h + "self_attn.k_proj.weight"].T).reshape(T, K, D).transpose(1, 0, 2)
        v = (a @ W[h + "self_attn.v_proj.weight"].T).reshape(T, K, D).transpose(1, 0, 2)
        q, k = rope(q, c["theta"]), rope(k, c["theta"])
        k, v = np.repeat(k, G, axis=0), np.repeat(v, G, axis=0)  # HF repeat_kv: KV head j serves heads jG..jG+G-1
        o = causal_attention(q, k, v).transpose(1, 0, 2).reshape(T, C)
        x = x + o @ W[h + "self_attn.o_proj.weight"].T
        m = rms_norm(x, W[h + "post_attention_layernorm.weight"], c["eps"])
        x = x + (silu(m @ W[h + "mlp.gate_proj.weight"].T) * (m @ W[h + "mlp.up_proj.weight"].T)) @ W[h + "mlp.down_proj.weight"].T
    x = rms_norm(x, W["model.norm.weight"], c["eps"])
    return x @ W["lm_head.weight"].T


def main():
    os.makedirs(OUT, exist_ok=True)
    rng = np.random.default_rng(30)
    ids = np.array(TOKENS)
    g = gpt2_weights(rng, GPT2)
    write_safetensors(os.path.join(OUT, "gpt2_tiny.safetensors"), g)
    gl = gpt2_logits(g, GPT2, ids)
    l = llama_weights(rng, LLAMA)
    names = sorted(l)
    half = len(names) // 2
    index = {"metadata": {"total_size": int(sum(v.nbytes for v in l.values()))}, "weight_map": {}}
    for i, part in enumerate((names[:half], names[half:])):
        fname = f"model-{i + 1:05d}-of-00002.safetensors"
        write_safetensors(os.path.join(OUT, "llama_tiny-" + fname), {k: l[k] for k in part})
        for k in part:
            index["weight_map"][k] = "llama_tiny-" + fname
    with open(os.path.join(OUT, "llama_tiny.safetensors.index.json"), "w") as f:
        json.dump(index, f, indent=1, sort_keys=True)
    ll = llama_logits(l, LLAMA, ids)
    write_safetensors(os.path.join(OUT, "logits.safetensors"),
                      {"tokens": ids.astype(np.float64), "gpt2": gl, "llama": ll},
                      {"gpt2": json.dumps(GPT2), "llama": json.dumps(LLAMA)})
    print("wrote", sorted(os.listdir(OUT)))


if __name__ == "__main__":
    sys.exit(main())
