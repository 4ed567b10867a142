#!/usr/bin/env python3
"""bench/compare_torch.py — train_gpt against its PyTorch eager twin, the same model, interleaved, as ratios.

    python3 bench/compare_torch.py --trainer build/examples/train_gpt                       # 1-thread configurations
    python3 bench/compare_torch.py --trainer build/examples/train_gpt --only default-2 l4d384-2 --rounds 3
    python3 bench/compare_torch.py --trainer build/examples/train_gpt --smoke               # CTest bench_compare_torch
    python3 bench/compare_torch.py --trainer build/examples/train_gpt --dtype bf16          # both sides in bf16
    python3 bench/compare_torch.py --trainer build-gpu/examples/train_gpt_cuda --device cuda --dtype bf16   # on a GPU

Both sides get every model flag explicitly (--layers --dim --heads --seq --batch --steps --lr --seed;
the trainer also its mesh: --pp 1 --dp R --fsdp 1 --cp 1 --tp 1, no experts), so a change of either
side's defaults cannot change what is compared. Each run's header is parsed back and checked: both
sides must report the sizes they were given, the same vocabulary, and the same parameter count
(train_gpt's `parameters: N` line, the twin's `N parameters`), which must also equal the count of the
twin's model computed here from the sizes (twin_parameters). Both must print a `summary:` line with
the steps asked for and a finite loss. Anything missing, unparsable or different exits non-zero with
a message that names both numbers — a format or default change fails, it is not measured.

Timing is taken from outside and the same way for both sides: each configuration runs --steps steps
and 2 steps; the difference (wall-clock, and CPU time = user + system of the child from getrusage)
over the extra steps is the per-step cost, so start-up (torch's import, reading the text, building
the model) and the final validation cancel out. Each round runs dtensor and PyTorch alternately
(dtensor first in odd rounds, PyTorch first in even ones: dtensor, torch, torch, dtensor, ...), so
load from other users hits both alike; the ratio dtensor / PyTorch is taken per round and the
median over rounds reported, with its range. On a loaded machine wall-clock time mostly measures
the load: the CPU-time ratio is then the figure to read. The output names the CPU (lscpu), the
load average at the start and the end, and the sizes of both sides.

Threads: dtensor runs R ranks (threads backend) with b threads per rank: for b > 1 --intra-op-threads b
(the host kernels on b threads, kernels/host/parallel.hpp; the GEMMs split over them, one BLAS call per
block, kernels/host/gemm.hpp) and the BLAS at one thread (DTENSOR_BLAS_THREADS=OPENBLAS_NUM_THREADS=1);
--threaded-blas gives the b threads to OpenBLAS instead (DTENSOR_BLAS_THREADS=b: OpenBLAS splits the
GEMMs itself, as before 2026-12-02). PyTorch runs with torch.set_num_threads(t) and
OMP_NUM_THREADS=MKL_NUM_THREADS=t.

GEMM kernels: PyTorch's MKL/oneDNN pick their kernels for the CPU (AVX-512 where it has it). So that
dtensor's OpenBLAS does the same, --blas-core auto (the default) removes an inherited
OPENBLAS_CORETYPE from the trainer's environment (a machine that exports OPENBLAS_CORETYPE=Haswell
runs the AVX2 kernels on an AVX-512 CPU: 30-38 % more CPU time per step, docs/benchmarks.md), so
the trainer runs as a user's does with nothing set: OpenBLAS's kernels, or wider ones dtensor
chooses by the CPU's features where OpenBLAS's table does not know the CPU (kernels/host/blas_core.hpp);
--blas-core NAME sets it, --blas-core inherit keeps the environment's. The output names OpenBLAS's
own choice (openblas_get_corename of the trainer's libopenblas, in the trainer's environment) and the
trainer's `host BLAS:` line (the kernels it runs).

--dtype bf16: the trainer's --dtype bf16 (the whole model in bf16 — parameters' compute copies,
activations, gradients; every kernel computes in fp32 and rounds once, the GEMMs on bf16 inputs with
fp32 sums: AMX tiles or AVX512-BF16 where the CPU has them, the `bf16 GEMMs:` part of its `host BLAS:`
line; fp32 master weights and AdamW state) against the twin's --dtype bf16 (torch.autocast("cpu",
bfloat16) over the forward and the loss: the Linears and attention in bf16 through oneDNN, LayerNorm,
GELU, embeddings and cross entropy in fp32; fp32 parameters, gradients and AdamW). Both report the
dtype they ran (train_gpt's mesh line, the twin's header) and it is checked. The default is f32.

--device cuda: train_gpt_cuda --device cuda against the twin's --device cuda, one rank on one GPU,
the GPT-2-124M-shaped configuration gpt2-gpu (12 layers, dim 768, 12 heads, seq 1024, batch 8; the
character vocabulary) unless --only says otherwise; --tf32 passes --tf32 to both (float GEMMs on
TF32 tensor cores). Both sides report the device they ran on (checked). The rounds interleave in
one call as on the CPU, so a GPU's clocks and caches warm both alike; read the wall-clock ratio
(the CPU-time columns are the host's, which waits for the GPU). The CPU configurations are refused
with --device cuda and the GPU one without it.

--smoke: 2 steps of every selected configuration, one run per side, no timing: the format and
parameter-count checks only. Without torch for --python (CI installs only Debian packages) the
PyTorch side is skipped, saying so, and the trainer's count is checked against twin_parameters.
--dtensor-only does that on purpose. --twin runs another twin (same flags, same output lines).
"""
import argparse
import math
import os
import re
import resource
import shlex
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))

MODELS = {  # the sizes, passed to both sides
    "default": {"layers": 2, "dim": 128, "heads": 4, "seq": 64, "batch": 16},
    "l4d384": {"layers": 4, "dim": 384, "heads": 6, "seq": 64, "batch": 16},  # GEMM-heavy
    "gpt2": {"layers": 12, "dim": 768, "heads": 12, "seq": 1024, "batch": 8},  # GPT-2 124M's shape (--device cuda)
}
TRAINING = {"lr": "3e-3", "seed": "1"}
SHORT_STEPS = 2  # the run subtracted from each timed one

# name: (model, dtensor ranks, threads per rank, torch threads, timed steps)
CONFIGS = {
    "default-1": ("default", 1, 1, 1, 200),
    "l4d384-1": ("l4d384", 1, 1, 1, 24),
    "default-2": ("default", 2, 1, 2, 200),
    "l4d384-2": ("l4d384", 2, 1, 2, 24),
    "default-1x2": ("default", 1, 2, 2, 200),  # one rank, two threads
    "l4d384-1x2": ("l4d384", 1, 2, 2, 24),
    "gpt2-gpu": ("gpt2", 1, 1, 1, 12),  # --device cuda only
}
DEFAULT_ONLY = ["default-1", "l4d384-1"]
GPU_CONFIGS = {"gpt2-gpu"}
DEFAULT_ONLY_GPU = ["gpt2-gpu"]

# What is read back. train_gpt (examples/train_gpt.cpp):
#   train_gpt: mesh pp 1 x dp 1 x ... = 1 ranks, threads backend, ... dtype f32
#   schedule 1f1b: ...; model: 2 layers, dim 128, 4 heads, seq 64, batch 16, vocab 86
#   parameters: 427008
#   summary: 200 steps in 8.1 s; final train loss 2.4012, validation loss 2.4567; 25301 tokens/s (25420 after the first step)
# the twin (bench/train_gpt_torch.py):
#   train_gpt_torch: torch 2.15.0+cu132, 1 thread(s), device cpu; vocab 86, 2 layers, dim 128, 4 heads, seq 64, batch 16; 427008 parameters; dtype f32
#   summary: 200 steps; final train loss 2.4012; 26000 tokens/s
DT_RANKS = re.compile(r"^train_gpt: mesh .*= (\d+) ranks", re.M)
DT_DTYPE = re.compile(r"^train_gpt: mesh .*\bdtype (\w+)", re.M)
DT_DEVICE = re.compile(r"^train_gpt: mesh .*\bdevice (\w+)", re.M)
DT_MODEL = re.compile(r"model: (\d+) layers, dim (\d+), (\d+) heads, seq (\d+), batch (\d+), vocab (\d+)")
DT_PARAMS = re.compile(r"^parameters: (\d+)$", re.M)
PT_HEADER = re.compile(r"^train_gpt_torch: torch (\S+), (\d+) thread\(s\)(?:, device [^;]*)?; vocab (\d+), (\d+) layers, dim (\d+), "
                       r"(\d+) heads, seq (\d+), batch (\d+); (\d+) parameters(?:; dtype (\w+).*)?$", re.M)
PT_DEVICE = re.compile(r"^train_gpt_torch: torch \S+, \d+ thread\(s\), device (\w+)", re.M)
SUMMARY = re.compile(r"^summary: (\d+) steps\b.*?final train loss ([^,;\s]+).*?\s(\d+) tokens/s"
                     r"(?: \(\d+ after the first step\))?$", re.M)


def fail(msg):
    print(f"compare_torch: FAILED: {msg}", file=sys.stderr)
    sys.exit(1)


def twin_parameters(m, vocab):
    """The parameter count of train_gpt_torch.py's GPT (and models::GPT's): token and position
    embeddings, per block two LayerNorms, qkv, proj, fc1 and fc2 with biases, the final LayerNorm,
    lm_head without bias and not tied."""
    d = m["dim"]
    block = 2 * 2 * d + (3 * d * d + 3 * d) + (d * d + d) + (4 * d * d + 4 * d) + (4 * d * d + d)
    return vocab * d + m["seq"] * d + m["layers"] * block + 2 * d + vocab * d


def model_flags(m, steps):
    flags = []
    for k in ("layers", "dim", "heads", "seq", "batch"):
        flags += [f"--{k}", str(m[k])]
    return flags + ["--steps", str(steps), "--lr", TRAINING["lr"], "--seed", TRAINING["seed"]]


def tail(text, n=3000):
    return text[-n:] if text else "(nothing)"


def run(cmd, env):
    """(stdout, wall seconds, CPU seconds of the child)"""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if r.returncode != 0:
        fail(f"{' '.join(cmd)} exited with {r.returncode}:\n{tail(r.stdout)}\n{tail(r.stderr)}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return r.stdout, wall, cpu


def need(regex, out, who, what, cmd):
    m = regex.search(out)
    if not m:
        fail(f"{who}: no {what} in the output of {' '.join(cmd)} (has its format changed?):\n{tail(out)}")
    return m


def parse(who, out, cmd):
    """The sizes, parameter count and summary a side reports, as a dict."""
    if who == "dtensor":
        ranks = need(DT_RANKS, out, who, "'train_gpt: mesh ... = N ranks' header", cmd)
        model = need(DT_MODEL, out, who, "'model: L layers, dim D, H heads, seq S, batch B, vocab V' header", cmd)
        params = need(DT_PARAMS, out, who, "'parameters: N' line", cmd)
        dtype = need(DT_DTYPE, out, who, "'dtype D' on the mesh line", cmd)
        r = {"threads": int(ranks.group(1)), "version": None, "params": int(params.group(1)), "dtype": dtype.group(1)}
        device = DT_DEVICE.search(out)
        r["device"] = device.group(1) if device else "cpu"
        blas = re.search(r"^host (?:BLAS|GEMM): .*$", out, re.M)
        r["blas"] = blas.group(0) if blas else None
        r.update(zip(("layers", "dim", "heads", "seq", "batch", "vocab"), map(int, model.groups())))
    else:
        h = need(PT_HEADER, out, who, "'train_gpt_torch: torch V, T thread(s); vocab ...; N parameters' header", cmd)
        r = {"version": h.group(1), "threads": int(h.group(2)), "dtype": h.group(10) or "f32"}  # an older twin: f32
        device = PT_DEVICE.search(out)
        r["device"] = device.group(1) if device else "cpu"  # an older twin: the CPU
        r.update(zip(("vocab", "layers", "dim", "heads", "seq", "batch", "params"), map(int, h.groups()[2:9])))
    s = need(SUMMARY, out, who, "'summary: N steps ... final train loss X ...; R tokens/s' line", cmd)
    r["steps"], r["tokens_per_s"] = int(s.group(1)), int(s.group(3))
    try:
        r["loss"] = float(s.group(2))
    except ValueError:
        fail(f"{who}: final train loss '{s.group(2)}' is not a number:\n{tail(out)}")
    return r


def check(name, m, steps, threads, sides, dtype, device="cpu"):
    """Both sides report what they were given, and the same parameter count; fails loudly otherwise."""
    for who, r in sides.items():
        if r["dtype"] != dtype:
            fail(f"{name}: {who} reports dtype {r['dtype']}, it was given {dtype}")
        if r["device"] != device:
            fail(f"{name}: {who} reports device {r['device']}, it was given {device}")
        for k, v in m.items():
            if r[k] != v:
                fail(f"{name}: {who} reports {k} {r[k]}, it was given {v}")
        if r["steps"] != steps:
            fail(f"{name}: {who}'s summary counts {r['steps']} steps, it was given {steps}")
        if r["threads"] != threads[who]:
            fail(f"{name}: {who} reports {r['threads']} ranks/threads, it was given {threads[who]}")
        if not math.isfinite(r["loss"]):
            fail(f"{name}: {who}'s final train loss is {r['loss']}")
    if "torch" in sides and "dtensor" in sides:
        d, p = sides["dtensor"], sides["torch"]
        if d["vocab"] != p["vocab"]:
            fail(f"{name}: the vocabularies differ: dtensor {d['vocab']}, PyTorch {p['vocab']}")
        if d["params"] != p["params"]:
            fail(f"{name}: the parameter counts differ: dtensor {d['params']}, PyTorch {p['params']} — not the same model")
    for who, r in sides.items():
        expected = twin_parameters(m, r["vocab"])
        if r["params"] != expected:
            fail(f"{name}: {who} has {r['params']} parameters, the twin's model of these sizes has {expected} "
                 "(twin_parameters in bench/compare_torch.py)")


def describe(who, r, ranks=None, blas=None):
    sizes = (f"{r['layers']} layers, dim {r['dim']}, {r['heads']} heads, seq {r['seq']}, batch {r['batch']}, "
             f"vocab {r['vocab']}; {r['params']:,} parameters")
    if who == "dtensor":
        return f"dtensor: {ranks} rank(s) x {blas} thread(s); {sizes}"
    return f"PyTorch {r['version']}: {r['threads']} thread(s); {sizes}"


def cpu_model():
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        m = re.search(r"^Model name:\s*(.+)$", out, re.M)
        fam = re.search(r"^CPU family:\s*(\d+)\s*^Model:\s*(\d+)", out, re.M)
        if m:  # a VM's name can be as short as "AMD EPYC": the family and model tell the generation
            return m.group(1).strip() + (f" (family {fam.group(1)}, model {fam.group(2)})" if fam else "")
    except OSError:
        pass
    try:
        m = re.search(r"^model name\s*:\s*(.+)$", open("/proc/cpuinfo").read(), re.M)
        return m.group(1).strip() if m else "unknown"
    except OSError:
        return "unknown"


def trainer_env(base, blas_core):
    """base with the trainer's OPENBLAS_CORETYPE as --blas-core asks."""
    env = dict(base)
    if blas_core == "auto":
        env.pop("OPENBLAS_CORETYPE", None)
    elif blas_core != "inherit":
        env["OPENBLAS_CORETYPE"] = blas_core
    return env


def openblas_core(trainer, env):
    """The kernel family the trainer's OpenBLAS runs in env ('?' when not found: not OpenBLAS, no ldd)."""
    try:
        libs = subprocess.run(["ldd", trainer], capture_output=True, text=True).stdout
    except OSError:
        return "?"
    m = re.search(r"=>\s*(\S*openblas\S*)", libs)
    if not m:
        return "?"
    probe = ("import ctypes, sys; l = ctypes.CDLL(sys.argv[1]); l.openblas_get_corename.restype = ctypes.c_char_p; "
             "print(l.openblas_get_corename().decode())")
    r = subprocess.run([sys.executable, "-c", probe, m.group(1)], capture_output=True, text=True, env=env)
    return r.stdout.strip() or "?"


def has_torch(python):
    return subprocess.run([python, "-c", "import torch"], capture_output=True).returncode == 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trainer", default="build/examples/train_gpt")
    ap.add_argument("--python", default=os.environ.get("DTENSOR_TORCH_PYTHON", sys.executable),
                    help="the Python that runs the twin, one with torch (default: $DTENSOR_TORCH_PYTHON, else this one)")
    ap.add_argument("--twin", default=os.path.join(HERE, "train_gpt_torch.py"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, help="steps of every configuration's timed run "
                    "(default: its own; the 2-step run's are subtracted)")
    ap.add_argument("--only", nargs="+", choices=list(CONFIGS), help=f"the configurations (default: {' '.join(DEFAULT_ONLY)}; "
                    f"with --device cuda: {' '.join(DEFAULT_ONLY_GPU)})")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                    help="cuda: train_gpt_cuda --device cuda against the twin on the GPU (see above)")
    ap.add_argument("--tf32", action="store_true", help="--device cuda: --tf32 on both sides")
    ap.add_argument("--smoke", action="store_true", help="2 steps, one run per side, the checks only (no timing)")
    ap.add_argument("--dtensor-only", action="store_true", help="run the trainer only (its format and parameter count)")
    ap.add_argument("--trainer-flags", default="", help="more flags for train_gpt, after the explicit ones "
                    "(--trainer-flags='--arch llama' must fail: another model)")
    ap.add_argument("--blas-core", default="auto",
                    help="OPENBLAS_CORETYPE for the trainer: auto (default: unset, the kernels are chosen for this CPU as MKL "
                         "does for PyTorch), inherit (the environment's), or a name (Haswell, SkylakeX, ...)")
    ap.add_argument("--dtype", choices=["f32", "bf16"], default="f32",
                    help="bf16: train_gpt --dtype bf16 against the twin under torch.autocast('cpu', bfloat16) (see above)")
    ap.add_argument("--threaded-blas", action="store_true",
                    help="the rows' threads per rank go to OpenBLAS (DTENSOR_BLAS_THREADS) rather than to dtensor's "
                         "intra-op pool, which then splits the GEMMs itself (the default)")
    ap.add_argument("--omp-passive", action="store_true",
                    help="run PyTorch with OMP_WAIT_POLICY=PASSIVE: on a machine loaded beyond its cores, OpenMP's "
                         "spinning threads otherwise collapse PyTorch's 2-thread runs")
    a = ap.parse_args()
    if a.only is None:
        a.only = DEFAULT_ONLY_GPU if a.device == "cuda" else DEFAULT_ONLY
    wrong = [c for c in a.only if (c in GPU_CONFIGS) != (a.device == "cuda")]
    if wrong:
        fail(f"--only {' '.join(wrong)}: not a configuration for --device {a.device} "
             f"(GPU: {' '.join(sorted(GPU_CONFIGS))}; CPU: the others)")
    if a.tf32 and a.device != "cuda":
        fail("--tf32 needs --device cuda")
    gpu_flags = ["--device", "cuda"] + (["--tf32"] if a.tf32 else []) if a.device == "cuda" else []
    if not os.access(a.trainer, os.X_OK):
        fail(f"no trainer at {a.trainer} (build the train_gpt target; --trainer PATH)")
    use_torch = not a.dtensor_only
    if use_torch and not has_torch(a.python):
        if not a.smoke:
            fail(f"{a.python} cannot import torch: install it (a venv with pip install torch) and pass its Python as "
                 "--python or DTENSOR_TORCH_PYTHON, or run --dtensor-only / --smoke")
        print(f"compare_torch: NOTE: {a.python} has no torch: the PyTorch side is skipped; the trainer's parameter "
              "count is checked against the twin's model computed from the sizes (twin_parameters)")
        use_torch = False
    if use_torch:  # the twin at least compiles
        subprocess.run([a.python, "-m", "py_compile", a.twin], check=True)

    load_at_start = os.getloadavg()
    print(f"compare_torch: CPU {cpu_model()}, {os.cpu_count()} logical CPUs; load average (1, 5, 15 min) "
          f"%.2f %.2f %.2f; trainer {a.trainer}; twin {a.twin}" % load_at_start)
    inherited = os.environ.get("OPENBLAS_CORETYPE")
    if a.device == "cuda":
        print(f"compare_torch: device cuda{' with TF32' if a.tf32 else ''}: read the wall-clock ratio (the CPU-time "
              "columns are the host's, which waits for the GPU)")
    else:
        print(f"compare_torch: dtensor's OpenBLAS picks its {openblas_core(a.trainer, trainer_env(os.environ, a.blas_core))} "
              f"kernels by itself (--blas-core {a.blas_core}; OPENBLAS_CORETYPE in this environment: {inherited or 'unset'})")
    if a.dtype == "bf16":
        print("compare_torch: dtype bf16: dtensor runs the whole model in bf16 (fp32 sums in every kernel, fp32 master "
              "weights and AdamW); PyTorch runs torch.autocast(device, bfloat16) over the forward and the loss (Linears "
              "and attention in bf16, the rest and the optimizer in fp32)")
    blas_line_shown = False
    rounds = 1 if a.smoke else a.rounds
    results = {}
    for name in a.only:
        model, ranks, blas, tthreads, steps = CONFIGS[name]
        m = MODELS[model]
        steps = SHORT_STEPS if a.smoke else (a.steps or steps)
        if not a.smoke and steps <= SHORT_STEPS:
            fail(f"--steps {steps}: the timed run needs more than {SHORT_STEPS} steps")
        threads = {"dtensor": ranks, "torch": tthreads}

        def commands(n):
            dt = [a.trainer, "--pp", "1", "--dp", str(ranks), "--fsdp", "1", "--cp", "1", "--tp", "1",
                  "--eval-every", str(n), "--dtype", a.dtype] + model_flags(m, n) + \
                 (["--intra-op-threads", str(blas)] if blas > 1 else []) + gpu_flags + shlex.split(a.trainer_flags)
            pt = [a.python, a.twin, "--threads", str(tthreads), "--dtype", a.dtype] + model_flags(m, n) + gpu_flags
            return {"dtensor": dt, "torch": pt}

        blas_threads = str(blas if a.threaded_blas else 1)
        envs = {"dtensor": dict(trainer_env(os.environ, a.blas_core), DTENSOR_BLAS_THREADS=blas_threads,
                                OPENBLAS_NUM_THREADS=blas_threads, OMP_NUM_THREADS=str(blas)),
                "torch": dict(os.environ, OMP_NUM_THREADS=str(tthreads), MKL_NUM_THREADS=str(tthreads))}
        if a.omp_passive:
            envs["torch"]["OMP_WAIT_POLICY"] = "PASSIVE"
        sides = ["dtensor", "torch"] if use_torch else ["dtensor"]
        full, short = commands(steps), commands(SHORT_STEPS)
        per_round = []
        for rnd in range(rounds):
            order = sides if rnd % 2 == 0 else sides[::-1]
            timed = {}
            reports = {}
            for who in order:
                out, wall, cpu = run(full[who], envs[who])
                reports[who] = parse(who, out, full[who])
                if who == "dtensor" and reports[who].get("blas") and not blas_line_shown:
                    print(f"compare_torch: the trainer's {reports[who]['blas']}")
                    blas_line_shown = True
                timed[who] = (wall, cpu)
            check(name, m, steps, threads, reports, a.dtype, a.device)
            if a.smoke:
                for who in sides:
                    print(f"{name}: {describe(who, reports[who], ranks, blas)}; {steps} steps, final train loss "
                          f"{reports[who]['loss']:.4f}")
                continue
            fig = {}
            for who in order:  # the 2-step runs, interleaved too
                out, wall, cpu = run(short[who], envs[who])
                check(name, m, SHORT_STEPS, threads, {who: parse(who, out, short[who])}, a.dtype, a.device)
                dw, dc = timed[who][0] - wall, timed[who][1] - cpu
                if dc <= 0:
                    fail(f"{name}: {who}'s {steps}-step run took no more CPU time than its {SHORT_STEPS}-step run "
                         f"(CPU {timed[who][1]:.2f} vs {cpu:.2f} s, wall {timed[who][0]:.2f} vs {wall:.2f} s): more --steps")
                tokens = m["batch"] * m["seq"] * (steps - SHORT_STEPS)
                # Wall-clock time under a load beyond the cores can make the short run the slower one:
                # that round has no wall figure (nan, left out of the wall median), its CPU figure stands.
                if dw <= 0:
                    print(f"compare_torch: NOTE: round {rnd + 1} {name} {who}: the {steps}-step run took no longer "
                          f"(wall) than the {SHORT_STEPS}-step run ({timed[who][0]:.2f} vs {wall:.2f} s): the load; "
                          "no wall-clock figure this round", file=sys.stderr)
                fig[who] = (tokens / dw if dw > 0 else math.nan, tokens / dc)
                print(f"round {rnd + 1} {name:11s} {who:8s} {fig[who][0]:8.0f} tokens/s (wall), {fig[who][1]:8.0f} "
                      f"tokens/CPU-s; self-reported {reports[who]['tokens_per_s']} tokens/s", file=sys.stderr)
            per_round.append(fig)
        results[name] = (reports, per_round)

    load_at_end = os.getloadavg()
    if a.smoke:
        print("compare_torch: smoke OK (formats, sizes and parameter counts checked; nothing timed)")
        return
    print("load average (1, 5, 15 min) at the start: %.2f %.2f %.2f, at the end: %.2f %.2f %.2f"
          % (load_at_start + load_at_end))
    for name, (reports, _) in results.items():
        _, ranks, blas, _, _ = CONFIGS[name]
        for who in reports:
            print(f"{name}: {describe(who, reports[who], ranks, blas)}")
    if not use_torch:
        print("| configuration | dtensor tokens/s (wall) | dtensor tokens/CPU-s |")
        print("|---|---:|---:|")
        for name, (_, per_round) in results.items():
            walls = [f['dtensor'][0] for f in per_round if not math.isnan(f['dtensor'][0])]
            print(f"| {name} | {statistics.median(walls) if walls else math.nan:,.0f} | "
                  f"{statistics.median(f['dtensor'][1] for f in per_round):,.0f} |")
        return
    print(f"dtype {a.dtype}{', device cuda' if a.device == 'cuda' else ''}{', TF32' if a.tf32 else ''}; dtensor / PyTorch over {rounds} interleaved rounds (median of the per-round ratios, range in brackets); "
          "timed steps = the run's steps minus a 2-step run's")
    print("| configuration | timed steps | PyTorch tokens/s | dtensor tokens/s | ratio (wall) | PyTorch tokens/CPU-s | "
          "dtensor tokens/CPU-s | ratio (CPU) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for name, (reports, per_round) in results.items():
        def med(who, i):
            xs = [f[who][i] for f in per_round if not math.isnan(f[who][i])]
            return statistics.median(xs) if xs else math.nan

        def ratio(i):  # rounds without a wall figure (nan) left out
            rs = [f["dtensor"][i] / f["torch"][i] for f in per_round
                  if not (math.isnan(f["dtensor"][i]) or math.isnan(f["torch"][i]))]
            return f"{statistics.median(rs):.2f} ({min(rs):.2f}–{max(rs):.2f})" if rs else "n/a (the load)"

        steps = reports["dtensor"]["steps"] - SHORT_STEPS
        print(f"| {name} | {steps} | {med('torch', 0):,.0f} | {med('dtensor', 0):,.0f} | {ratio(0)} | "
              f"{med('torch', 1):,.0f} | {med('dtensor', 1):,.0f} | {ratio(1)} |")


if __name__ == "__main__":
    main()
