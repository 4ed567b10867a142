#!/usr/bin/env python3
"""scripts/bad_input_catalogue.py — the outside catalogue of bad inputs, run against a build.

    scripts/bad_input_catalogue.py --build build-rel            # every case, a tally at the end
    scripts/bad_input_catalogue.py --build build-rel --only mpi # the cases whose name has "mpi"
    scripts/bad_input_catalogue.py --build build-rel --skip mpi # all but those
    scripts/bad_input_catalogue.py --build build-rel --list     # the cases, not run

Runs train_gpt, train_vit, plan_at_scale and the MPI trainer (train_gpt --backend mpi, 4
processes) with bad input: every flag given an out-of-range, garbage or huge value (negative, 0,
2^31, 1e300, inf, nan, empty), a directory where a file is expected and the reverse, missing and
read-only directories, ranks given different flags (each in turn), environment variables with
bad values, and a rank killed mid-run. Each case ends in one class:

    clear    a non-zero exit whose output names what was wrong (the case's `names` text)
    unclear  a non-zero exit that does not name it
    silent   exit 0 where the input is wrong (or a non-finite loss printed)
    hang     still running after --timeout seconds (30 by default)
    crash    ended by a signal (or MPI's abort of a signal)
    ok       valid input that ran (the cases that are in range, kept to check they still run)

Exit status 1 when any case is unclear, silent, hang or crash. Meant for a Release build (the
collective check off, as users run): docs/errors.md has the last tally.
"""
import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

MPI_ENV = {"OMPI_MCA_mpi_yield_when_idle": "1", "OMPI_MCA_btl_vader_single_copy_mechanism": "none",
           "DTENSOR_TIMEOUT_MS": "20000"}
# A small train_gpt run: 4 ranks, two steps of a tiny model (seconds).
GPT = ["--pp", "1", "--dp", "1", "--fsdp", "2", "--cp", "1", "--tp", "2", "--steps", "2", "--eval-every", "2",
       "--seq", "16", "--dim", "32"]
VIT = ["--steps", "2", "--eval-every", "2"]
PLAN = ["--layers", "4", "--dim", "256", "--heads", "8", "--seq", "256", "--batch", "64", "--dp", "2", "--tp", "2",
        "--pp", "2", "--microbatches", "4"]

# Garbage for any numeric flag: each must be refused naming the flag.
GARBAGE = ["-1", "0", "2147483648", "1e300", "inf", "nan", "", "abc", "99999999999999999999999"]


class Case:
    def __init__(self, name, argv, names, valid=False, env=None, kill_after=None):
        self.name, self.argv, self.names, self.valid, self.env = name, argv, names, valid, env or {}
        self.kill_after = kill_after  # seconds: SIGKILL one MPI rank then
        self.expect_fail = not valid


def cases(build, tmp):
    ex = os.path.join(build, "examples")
    gpt, vit, plan = (os.path.join(ex, p) for p in ("train_gpt", "train_vit", "plan_at_scale"))
    mpirun = shutil.which("mpirun") or "mpirun"
    launcher = [mpirun, "--allow-run-as-root", "--oversubscribe", "-x", "DTENSOR_TIMEOUT_MS"]
    out = []
    # Numeric flags: name, the program, its base flags, the values that are in range (valid).
    numeric = {
        gpt: (GPT, ["--layers", "--heads", "--dim", "--seq", "--batch", "--experts", "--topk", "--capacity",
                    "--moe-every", "--steps", "--eval-every", "--lr", "--seed", "--kv-heads", "--ffn", "--save-every",
                    "--inner-steps", "--staleness", "--clients", "--kfold", "--pp", "--dp", "--fsdp", "--cp", "--tp",
                    "--ep", "--zero", "--microbatches"]),
        vit: (VIT, ["--layers", "--heads", "--dim", "--patches", "--patch-dim", "--classes", "--batch", "--steps",
                    "--eval-every", "--lr", "--seed", "--pp", "--dp", "--fsdp", "--cp", "--tp", "--zero",
                    "--microbatches", "--experts", "--topk", "--moe-every", "--ep"]),
        plan: (PLAN, ["--layers", "--dim", "--heads", "--kv-heads", "--ffn", "--vocab", "--seq", "--mlp-ratio",
                      "--batch", "--dp", "--tp", "--pp", "--zero", "--hsdp", "--cp", "--microbatches",
                      "--stages-per-rank", "--experts", "--topk", "--ep", "--moe-every", "--capacity",
                      "--peak-tflops", "--gpus", "--top", "--finalists"]),
    }
    for prog, (base, flags) in numeric.items():
        p = os.path.basename(prog)
        for f in flags:
            for v in GARBAGE:
                # 0 is in range for a few flags (--seed, --staleness, --clients, --experts, --zero of plan):
                # such a run must still end well (ok or clear), never silent/hang/crash.
                # In range: 0 for a few flags, 2^31 for the 64-bit seed. Such a run must end well (ok).
                in_range = (v == "0" and f in ("--seed", "--staleness", "--clients", "--experts")) or \
                    (v == "0" and p == "plan_at_scale" and f == "--zero") or (v == "2147483648" and f == "--seed") or \
                    (f == "--capacity" and v in ("2147483648", "1e300", "99999999999999999999999"))  # = dropless
                # The MoE flags act only with experts: give them some, so that the value is used.
                moe = ["--experts", "4"] if p == "train_gpt" and f in ("--topk", "--capacity", "--moe-every") else []
                if p == "train_vit" and f in ("--topk", "--moe-every", "--ep"):
                    moe = ["--experts", "4", "--cp", "1"]
                out.append(Case(f"{p} {f} '{v}'", [prog] + base + moe + [f, v], re.escape(f), valid=in_range))
    # Strings with a fixed set of values.
    for prog, base, f in [(gpt, GPT, "--schedule"), (gpt, GPT, "--cp-kind"), (gpt, GPT, "--arch"), (gpt, GPT, "--dtype"),
                          (gpt, GPT, "--backend"), (gpt, GPT, "--device"), (gpt, GPT, "--sync"),
                          (vit, VIT, "--backend"), (vit, VIT, "--cp-kind"), (vit, VIT, "--schedule"), (plan, PLAN, "--arch"),
                          (plan, PLAN, "--dtype"), (plan, PLAN, "--device"), (plan, PLAN, "--cp-kind"),
                          (plan, PLAN, "--schedule"), (plan, PLAN, "--device-field")]:
        for v in ["", "bogus", "-1"]:
            out.append(Case(f"{os.path.basename(prog)} {f} '{v}'", [prog] + base + [f, v], re.escape(f)))
    out += vit_cases(vit)
    # Files and directories.
    d = tmp
    ro = os.path.join(d, "readonly")
    os.makedirs(ro, exist_ok=True)
    os.chmod(ro, 0o555)
    afile = os.path.join(d, "a-file.txt")
    with open(afile, "w") as fh:
        fh.write("not a checkpoint\n")
    empty = os.path.join(d, "empty.txt")
    open(empty, "w").close()
    emptydir = os.path.join(d, "emptydir")
    os.makedirs(emptydir, exist_ok=True)
    missing = os.path.join(d, "missing", "deeper")
    paths = {
        "--data": [(d, "directory"), (missing, "missing"), (empty, "empty file"), ("", "empty")],
        "--save-dir": [(afile, "regular file"), (os.path.join(ro, "ckpt"), "read-only parent"), ("", "empty"),
                       ("/dev/null/ckpt", "under a device")],
        "--resume": [(afile, "regular file"), (emptydir, "empty directory"), (missing, "missing"), ("", "empty")],
        "--trace": [(d, "directory"), (os.path.join(missing, "t.json"), "missing directory"),
                    (os.path.join(ro, "t.json"), "read-only directory"), ("", "empty")],
        "--plot": [(d, "directory"), (os.path.join(missing, "p.svg"), "missing directory"),
                   (os.path.join(ro, "p.svg"), "read-only directory"), ("", "empty")],
    }
    for f, vs in paths.items():
        for v, what in vs:
            extra = ["--save-every", "1"] if f == "--save-dir" else []
            # As root a read-only directory is writable: the run is then valid.
            out.append(Case(f"train_gpt {f} {what}", [gpt] + GPT + extra + [f, v],
                            re.escape(f) + ("|no checkpoint at" if f == "--resume" else ""),
                            valid="read-only" in what and os.geteuid() == 0))
    for v, what in [(d, "directory"), (os.path.join(missing, "t.json"), "missing directory"),
                    (os.path.join(ro, "t.json"), "read-only directory"), ("", "empty")]:
        out.append(Case(f"plan_at_scale --trace {what}", [plan] + PLAN + ["--trace", v], re.escape("--trace"),
                        valid="read-only" in what and os.geteuid() == 0))
    for v, what in [(d, "directory"), (missing, "missing"), (empty, "empty file"), (afile, "garbage file")]:
        out.append(Case(f"plan_at_scale --device-file {what}", [plan] + PLAN + ["--device-file", v],
                        re.escape("--device-file") + "|device file|" + re.escape(v)))
    # Environment variables.
    for var in ["DTENSOR_TIMEOUT_MS", "DTENSOR_CHECK_COLLECTIVES", "DTENSOR_VERIFY_EVERY", "DTENSOR_HOST_ISA",
                "DTENSOR_BLAS_THREADS", "DTENSOR_BLAS_CORETYPE", "DTENSOR_PROGRESS"]:
        for v in ["-1", "abc", "1e300", "99999999999999999999", " 1"]:
            out.append(Case(f"train_gpt env {var}='{v}'", [gpt] + GPT, var, env={var: v}))
    # MPI: one rank of four given another value of a flag; every rank must fail naming the flag.
    small = ["--backend", "mpi", "--pp", "1", "--dp", "1", "--fsdp", "2", "--cp", "1", "--tp", "2", "--steps", "2",
             "--eval-every", "2", "--seq", "16", "--dim", "32"]
    differ = [["--seed", "7"], ["--lr", "0.01"], ["--dim", "64"], ["--steps", "3"], ["--layers", "3"],
              ["--heads", "2"], ["--seq", "32"], ["--batch", "8"], ["--microbatches", "2"], ["--eval-every", "1"],
              ["--zero", "2"], ["--no-sp"], ["--checkpoint"], ["--check-finite"], ["--arch", "llama"],
              ["--dtype", "bf16"], ["--experts", "4"], ["--capacity", "2"], ["--data", afile],
              ["--save-every", "1", "--save-dir", os.path.join(d, "ck")], ["--tp", "1", "--fsdp", "4"],
              ["--cp", "2", "--fsdp", "1"], ["--schedule", "gpipe"]]
    for extra in differ:
        argv = launcher + ["-np", "3", gpt] + small + [":", "-np", "1", gpt] + small + extra
        flag = "--sp" if extra[0] == "--no-sp" else extra[0]
        out.append(Case(f"mpi rank 3 given {' '.join(extra[:2])}", argv, re.escape(flag), env=MPI_ENV))
    # MPI: bad value on every rank (the same path as threads, checked once).
    out.append(Case("mpi --steps 0 on all", launcher + ["-np", "4", gpt] + small + ["--steps", "0"], "--steps",
                    env=MPI_ENV))
    out.append(Case("mpi 3 ranks for a 4-rank mesh", launcher + ["-np", "3", gpt] + small, "ranks", env=MPI_ENV))
    # MPI: a rank killed mid-run: the job must end (not hang) with an error.
    longer = [a if a != "2" else "2" for a in small]
    longer[longer.index("--steps") + 1] = "400"
    out.append(Case("mpi rank killed mid-run", launcher + ["-np", "4", gpt] + longer, "", env=MPI_ENV,
                    kill_after=4.0))
    # train_vit under MPI (8 ranks by default; 4 here): one rank given another value of a flag,
    # 3 ranks for a 4-rank mesh, and a rank killed mid-run.
    vsmall = ["--backend", "mpi", "--fsdp", "2", "--cp", "1", "--tp", "2", "--steps", "2", "--eval-every", "2"]
    vdiffer = [["--seed", "7"], ["--lr", "0.01"], ["--dim", "32"], ["--steps", "3"], ["--layers", "3"],
               ["--heads", "2"], ["--patches", "8"], ["--patch-dim", "24"], ["--classes", "5"], ["--batch", "16"],
               ["--eval-every", "1"], ["--zero", "2"], ["--no-sp"], ["--tp", "1", "--fsdp", "4"],
               ["--cp", "2", "--fsdp", "1"], ["--cp-kind", "ulysses"], ["--experts", "4"],
               ["--pp", "2", "--fsdp", "1"]]
    for extra in vdiffer:
        argv = launcher + ["-np", "3", vit] + vsmall + [":", "-np", "1", vit] + vsmall + extra
        flag = "--sp" if extra[0] == "--no-sp" else extra[0]
        out.append(Case(f"mpi train_vit rank 3 given {' '.join(extra[:2])}", argv, re.escape(flag), env=MPI_ENV))
    # Pipeline ranks given different schedules or micro-batch counts.
    vpipe = vsmall[:] + ["--pp", "2", "--fsdp", "1", "--layers", "4"]
    for extra in [["--schedule", "gpipe"], ["--microbatches", "2"]]:
        argv = launcher + ["-np", "3", vit] + vpipe + [":", "-np", "1", vit] + vpipe + extra
        out.append(Case(f"mpi train_vit pp rank 3 given {' '.join(extra)}", argv, re.escape(extra[0]), env=MPI_ENV))
    out.append(Case("mpi train_vit 3 ranks for a 4-rank mesh", launcher + ["-np", "3", vit] + vsmall, "ranks",
                    env=MPI_ENV))
    vlonger = vsmall[:]
    vlonger[vlonger.index("--steps") + 1] = "4000"
    out.append(Case("mpi train_vit rank killed mid-run", launcher + ["-np", "4", vit] + vlonger, "", env=MPI_ENV,
                    kill_after=4.0))
    return out


def vit_cases(vit):
    """train_vit's sizes that do not divide, stages against layers, huge sizes: each a clear error
    (or ok where the size is in range: uneven shards are the normal case)."""
    out = []
    def case(what, extra, names, valid=False):
        out.append(Case(f"train_vit {what}", [vit] + VIT + extra, names, valid=valid))
    # Divisibility: the heads over tp (and tp x cp for Ulysses), dim over heads.
    case("--heads 3 (--dim 64)", ["--heads", "3"], "--heads")
    case("--heads 6 --dim 66 over --tp 4", ["--heads", "6", "--dim", "66", "--tp", "4", "--cp", "1"], "--heads|--tp")
    case("--tp 3", ["--tp", "3"], "--tp|--heads")
    case("ulysses --heads 2 over cp x tp 4", ["--cp-kind", "ulysses", "--heads", "2", "--dim", "64"], "--heads|ulysses")
    case("--dim 8 --heads 8", ["--dim", "8", "--heads", "8", "--tp", "1"], "", valid=True)
    # Uneven sizes are the normal case: they train.
    case("--patches 15 over --cp 2", ["--patches", "15"], "", valid=True)
    case("--patches 1 over --cp 2", ["--patches", "1"], "", valid=True)  # the losses of --cp 1
    case("--classes 7 over --tp 2", ["--classes", "7"], "", valid=True)
    case("--batch 3 over fsdp 2", ["--batch", "3"], "", valid=True)
    case("--batch 1 over dp 4", ["--batch", "1", "--dp", "4", "--fsdp", "1", "--cp", "1", "--tp", "1"], "",
         valid=True)  # ranks without an image: the losses of --dp 1
    case("--patch-dim 1", ["--patch-dim", "1"], "", valid=True)
    # Pipeline stages against layers and micro-batches.
    case("--pp 2 --layers 1", ["--pp", "2", "--layers", "1"], "--layers")
    case("--pp 4 --layers 3", ["--pp", "4", "--layers", "3", "--cp", "1", "--fsdp", "1"], "--layers")
    case("zbv --pp 2 --layers 3", ["--pp", "2", "--schedule", "zbv", "--layers", "3", "--cp", "1"], "--layers")
    case("--pp 2 --microbatches 3 (batch 32)", ["--pp", "2", "--microbatches", "3"], "--microbatches")
    case("--pp 2 --microbatches 64 (batch 32)", ["--pp", "2", "--microbatches", "64"], "--microbatches|--batch")
    case("--pp 2 --microbatches 32 --batch 32 over fsdp 2", ["--pp", "2", "--microbatches", "32", "--cp", "1"],
         "", valid=True)
    case("--microbatches 2 without --pp", ["--microbatches", "2"], "--microbatches")
    case("--schedule without --pp", ["--schedule", "zbv"], "--schedule|--pp", valid=True)
    # Experts over ep.
    case("--experts 3 --ep 2", ["--experts", "3", "--ep", "2", "--cp", "1"], "--experts|--ep")
    case("--experts 4 --ep 3", ["--experts", "4", "--ep", "3", "--cp", "1"], "--ep")
    case("--topk 5 --experts 4", ["--experts", "4", "--topk", "5", "--cp", "1"], "--topk")
    case("--topk without --experts", ["--topk", "1"], "--topk")
    case("--moe-every without --experts", ["--moe-every", "2"], "--moe-every")
    case("--moe-every 3 beyond --layers 2", ["--experts", "4", "--moe-every", "3", "--cp", "1"], "--moe-every")
    case("--ep without --experts", ["--ep", "2"], "--ep")
    case("--zero 2 with --fsdp 1", ["--zero", "2", "--fsdp", "1"], "", valid=True)  # ZeRO over one rank: DDP
    case("--cp-kind without --cp", ["--cp-kind", "ulysses", "--cp", "1"], "", valid=True)
    # Huge sizes: an error naming the sizes promptly, not minutes of allocating or bad_alloc.
    for f, v in [("--dim", "1048576"), ("--layers", "100000"), ("--patches", "16777216"), ("--patch-dim", "1073741824"),
                 ("--classes", "1073741824"), ("--batch", "1073741824"), ("--experts", "100000"),
                 ("--heads", "1048576")]:
        extra = ["--cp", "1"] if f == "--experts" else []
        case(f"{f} huge {v}", extra + [f, v] + (["--dim", "1048576"] if f == "--heads" else []), re.escape(f))
    return out


def classify(c, rc, output, elapsed, timeout):
    if rc is None:
        return "hang"
    if rc < 0 or rc in (134, 136, 139) or re.search(r"Segmentation fault|free\(\)|double free|core dumped|"
                                                    r"terminate called|Aborted", output):
        if c.kill_after is not None and not re.search(r"free\(\)|double free|Segmentation", output):
            return "clear" if rc != 0 else "silent"
        return "crash"
    nonfinite = re.search(r"loss (nan|-?inf)", output)
    if rc == 0:
        if nonfinite:
            return "silent"
        return "ok" if not c.expect_fail else "silent"
    if c.kill_after is not None:
        return "clear"
    # plan_at_scale's verdict on a plan that does not fit (exit 3 after its report): a valid answer.
    if rc == 3 and "DOES NOT FIT" in output:
        return "ok"
    return "clear" if re.search(c.names, output) else "unclear"


def run(c, timeout):
    env = dict(os.environ)
    env.update(c.env)
    t0 = time.time()
    p = subprocess.Popen(c.argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    killed_rank = False
    try:
        if c.kill_after is not None:
            try:
                p.wait(timeout=c.kill_after)
            except subprocess.TimeoutExpired:
                # SIGKILL one train_gpt process of the job (a child of mpirun).
                kids = subprocess.run(["pgrep", "-P", str(p.pid)], capture_output=True, text=True).stdout.split()
                if kids:
                    os.kill(int(kids[-1]), signal.SIGKILL)
                    killed_rank = True
        out, _ = p.communicate(timeout=max(1.0, timeout - (time.time() - t0)))
        rc = p.returncode
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, _ = p.communicate()
        rc = None
    text = out.decode(errors="replace")
    if c.kill_after is not None and not killed_rank and rc == 0:
        text += "\n(catalogue: the run ended before a rank could be killed)"
    return rc, text, time.time() - t0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", required=True)
    ap.add_argument("--only", default="")
    ap.add_argument("--skip", default=None, help="leave out the cases whose name has this text")
    ap.add_argument("--timeout", type=float, default=30)
    ap.add_argument("--list", action="store_true")
    ap.add_argument("--verbose", action="store_true")
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="dtensor-catalogue-")
    try:
        # Programs not built are skipped (say which), so that one trainer can be checked alone.
        todo = [c for c in cases(a.build, tmp) if a.only in c.name and (a.skip is None or a.skip not in c.name)]
        have = [c for c in todo if os.path.exists(next(x for x in c.argv if "/examples/" in x))]
        for prog in sorted({next(x for x in c.argv if "/examples/" in x) for c in todo} -
                           {next(x for x in c.argv if "/examples/" in x) for c in have}):
            print(f"skipped: {prog} is not built")
        todo = have
        if a.list:
            for c in todo:
                print(c.name)
            return 0
        tally = {}
        for c in todo:
            rc, text, secs = run(c, a.timeout)
            k = classify(c, rc, text, secs, a.timeout)
            tally[k] = tally.get(k, 0) + 1
            last = [l for l in text.strip().splitlines() if l.strip()][-1:] or [""]
            line = f"{k:8} {secs:5.1f}s rc={rc}  {c.name}"
            if k not in ("clear", "ok") or a.verbose:
                line += "\n           " + last[0][:300]
            print(line, flush=True)
        print("tally: " + ", ".join(f"{k} {v}" for k, v in sorted(tally.items())) + f" (of {len(todo)})")
        return 1 if any(k in tally for k in ("unclear", "silent", "hang", "crash")) else 0
    finally:
        os.chmod(os.path.join(tmp, "readonly"), 0o755) if os.path.isdir(os.path.join(tmp, "readonly")) else None
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
