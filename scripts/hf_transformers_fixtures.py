#!/usr/bin/env python3
"""Real Hugging Face checkpoints for dtensor's import and export (models/hf_checkpoint.hpp).

  write (rewrites tests/data/hf/gpt2_hf/, llama_hf/, llama3_hf/ and transformers_logits.safetensors):
      python scripts/hf_transformers_fixtures.py
  write some of them only (the other logits in transformers_logits.safetensors kept):
      python scripts/hf_transformers_fixtures.py --only llama3
  check dtensor's export with transformers (DIR: what test_llama wrote with DTENSOR_HF_EXPORT=DIR):
      python scripts/hf_transformers_fixtures.py --check-export DIR

Needs torch, safetensors and transformers (not on CI: the files are committed, and
tests/unit/test_llama.cpp "[hf]" reads them). Write mode builds a tiny GPT2LMHeadModel and a
tiny LlamaForCausalLM with transformers itself (fixed seed, weights redrawn at std 0.2 so that
the logits are not all near zero, norms' weights near 1), saves each with save_pretrained and a
small max_shard_size (so each is sharded, with model.safetensors.index.json, as large models
are; generation_config.json is not kept), and stores transformers' own float32 logits of TOKENS
(eager attention, eval mode). It also runs the models in float64 and prints how far the float32
logits are from those: the test's tolerance (1e-5) must be well above that gap.

llama3_hf is a Llama with Llama 3.1's rope scaling (rope_type "llama3"; theta 100 and
original_max_position_embeddings 64, so that of each head's 4 frequency pairs one is kept, two are
smoothed and one divided by the factor: every branch of the remap is used at positions 0..11).

Check mode loads DIR/gpt2, DIR/llama and DIR/llama3 (dtensor's export_hf_safetensors: one
model.safetensors each and the config.json it writes; where it wrote none, the fixture's) with
from_pretrained and asserts that their logits equal the committed ones within TOL.
"""
import os
import shutil
import sys

import torch
import transformers
from safetensors.torch import load_file, save_file
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

HF = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "data", "hf")
TOKENS = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8]
TOL = 1e-5
# Tiny, and uneven where dtensor shards: vocab 29 and 31 over tp 4 (8, 7, 7, 7 rows); heads and
# KV heads divide tp 4 as the models require; 8 Llama heads share 4 KV heads (grouped-query).
GPT2 = GPT2Config(vocab_size=29, bos_token_id=0, eos_token_id=0, n_positions=16, n_embd=16, n_layer=2, n_head=4, n_inner=None,
                  activation_function="gelu_new", layer_norm_epsilon=1e-5, resid_pdrop=0.0, embd_pdrop=0.0,
                  attn_pdrop=0.0)
LLAMA = LlamaConfig(vocab_size=31, hidden_size=32, intermediate_size=40, num_hidden_layers=2, num_attention_heads=8,
                    num_key_value_heads=4, max_position_embeddings=16, rms_norm_eps=1e-6, rope_theta=10000.0,
                    tie_word_embeddings=False, attention_bias=False, mlp_bias=False, hidden_act="silu")
LLAMA3_ROPE = {"rope_type": "llama3", "rope_theta": 100.0, "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 64}
LLAMA3 = LlamaConfig(vocab_size=31, hidden_size=32, intermediate_size=40, num_hidden_layers=2, num_attention_heads=4,
                     num_key_value_heads=2, max_position_embeddings=128, rms_norm_eps=1e-6, rope_parameters=LLAMA3_ROPE,
                     tie_word_embeddings=False, attention_bias=False, mlp_bias=False, hidden_act="silu")
MODELS = (("gpt2", GPT2LMHeadModel, GPT2), ("llama", LlamaForCausalLM, LLAMA), ("llama3", LlamaForCausalLM, LLAMA3))


def build(cls, config, seed):
    torch.manual_seed(seed)
    config._attn_implementation = "eager"
    model = cls(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            norm = "ln" in name or "norm" in name
            if norm and name.endswith("weight"):
                p.copy_(1 + 0.1 * torch.randn_like(p))
            else:
                p.copy_(0.2 * torch.randn_like(p))
    return model


def logits_of(model, dtype=torch.float32):
    with torch.no_grad():
        return model.to(dtype)(torch.tensor([TOKENS])).logits[0].to(torch.float32)


def write(only=None):
    gold = os.path.join(HF, "transformers_logits.safetensors")
    out = load_file(gold) if only and os.path.exists(gold) else {}
    out["tokens"] = torch.tensor(TOKENS, dtype=torch.float32)
    for seed, (name, cls, config) in enumerate(MODELS):
        if only and name not in only:
            continue
        model = build(cls, config, seed + 1)
        d = os.path.join(HF, name + "_hf")
        shutil.rmtree(d, ignore_errors=True)
        model.save_pretrained(d, max_shard_size="20KB", safe_serialization=True)
        if os.path.exists(os.path.join(d, "generation_config.json")):
            os.remove(os.path.join(d, "generation_config.json"))
        out[name] = logits_of(model)
        gap = (out[name].double() - logits_of(model, torch.float64).double()).abs().max().item()
        print(f"{name}: {sorted(os.listdir(d))}, logits {tuple(out[name].shape)}, "
              f"max |logit| {out[name].abs().max().item():.3g}, float32 vs float64 {gap:.3g}")
    save_file(out, gold,
              metadata={"format": "pt", "transformers": transformers.__version__, "torch": torch.__version__})


def check_export(root):
    gold = load_file(os.path.join(HF, "transformers_logits.safetensors"))
    ok = True
    # gpt2_seq12: GPT-2 exported from a model of context 12 (the fixture's table has 16 rows): its
    # own config.json says n_positions 12; its logits of the 12 tokens are gpt2's.
    for name, cls, gold_name in [(m[0], m[1], m[0]) for m in MODELS] + [("gpt2_seq12", GPT2LMHeadModel, "gpt2")]:
        d = os.path.join(root, name)
        if not os.path.isdir(d):
            print(f"{name}: no export in {d}, skipped")
            continue
        if not os.path.exists(os.path.join(d, "config.json")):
            shutil.copy(os.path.join(HF, gold_name + "_hf", "config.json"), d)
        model, info = cls.from_pretrained(d, attn_implementation="eager", output_loading_info=True)
        model.eval()
        missing = list(info["missing_keys"]) + list(info.get("mismatched_keys", []))
        if missing:  # a weight left at its random init would be a silent failure
            print(f"{name}: FAIL: not loaded from {d}: {sorted(map(str, missing))}")
            ok = False
        got = logits_of(model)
        diff = (got - gold[gold_name]).abs().max().item()
        print(f"{name}: from_pretrained({d}): max |logits - transformers' own| = {diff:.3g} (tolerance {TOL:g})")
        ok &= diff <= TOL
    print(("PASS" if ok else "FAIL") + f": dtensor's export loaded by transformers {transformers.__version__}")
    return 0 if ok else 1


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--check-export":
        sys.exit(check_export(sys.argv[2]))
    if len(sys.argv) > 2 and sys.argv[1] == "--only":
        write(set(sys.argv[2:]))
        sys.exit(0)
    if len(sys.argv) != 1:
        sys.exit(__doc__)
    write()
