#!/usr/bin/env python3
"""tests/docs/check_docs.py — the docs' commands and complete snippets, run and compiled.

    check_docs.py --source DIR --bin DIR --cxx COMPILER [--work DIR] [FILE.md ...]

Reads every fenced block of docs/*.md and README.md (or the FILEs given) and:

* runs every shell line that starts one of the project's programs (train_gpt, train_gpt_cuda,
  generate, plan_at_scale, quickstart, scripts/run-main.sh; by bare name, as build*/examples/NAME, ./NAME,
  after `VAR=value` settings, under `mpirun -n N`, inside a `for` loop or a pipe), in blocks
  tagged sh, bash, console or untagged, in the order they appear, one working directory per
  file (so a `--resume DIR` finds what an earlier `--save-dir DIR` wrote). Each program is a
  wrapper around the one built in --bin that keeps the command's flags and makes it short:
  train_gpt runs 2 steps (3 with --resume), validates and saves every step; mpirun runs the
  program on the threads backend (--backend mpi dropped), so the flags are checked without an
  MPI launcher; scripts/run-main.sh runs the script itself with the built trainer
  (DTENSOR_MAIN_TRAINER), so its own defaults are checked too. A program that was not built
  (train_gpt_cuda without CUDA), train_gpt_cuda where no GPU is usable, and NCCL commands (a GPU
  per rank) are reported as skipped;
* compiles every C++ block tagged `cpp complete` (a whole translation unit) with
  `COMPILER -std=c++20 -fsyntax-only -I include`.

Markers (words after the language in the opening fence):
  ```sh no-run      commands shown, not run (what needs a GPU cluster, a network, root)
  ```cpp complete   a whole translation unit: compiled
  ```cpp            a fragment (names from the text around it): not compiled
Exit status 1 when a command fails or a snippet does not compile, naming file:line.
"""
import argparse
import glob
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time

PROGRAMS = ["train_gpt_cuda", "train_gpt", "generate", "plan_at_scale", "quickstart"]
SHELL_TAGS = {"", "sh", "bash", "console", "shell"}


def fenced_blocks(path):
    """(line number of the opening fence, language, marker words, body lines) of each block."""
    lines = open(path, encoding="utf-8").read().split("\n")
    i = 0
    while i < len(lines):
        m = re.match(r"^\s*```\s*([^\s`]*)\s*(.*)$", lines[i])
        if not m:
            i += 1
            continue
        j = i + 1
        while j < len(lines) and not re.match(r"^\s*```\s*$", lines[j]):
            j += 1
        if j == len(lines):
            raise SystemExit(f"{path}:{i + 1}: a fence that is never closed")
        yield i + 1, m.group(1).lower(), m.group(2).split(), lines[i + 1:j]
        i = j + 1


def shell_lines(body):
    """Logical lines: `\\` continuations joined; comments after the command are left to bash."""
    out, cur, start = [], "", 0
    for k, line in enumerate(body):
        if not cur:
            start = k
        if line.rstrip().endswith("\\"):
            cur += line.rstrip()[:-1] + " "
            continue
        out.append((start, cur + line))
        cur = ""
    if cur:
        out.append((start, cur))
    return out


PROGRAM_RE = re.compile(
    r"(?<![\w/.-])(?:(?:\./)?build[\w.-]*/examples/|\./)?(" + "|".join(PROGRAMS) + r")(?![\w.-])")
RUN_MAIN_RE = re.compile(r"(?<![\w/.-])(?:\./)?scripts/run-main\.sh(?![\w.-])")


def runs_a_program(line):
    code = line.split("#", 1)[0] if not line.lstrip().startswith("#") else ""
    # A program in command position: at the start, after VAR=value, mpirun's options, ; | && do.
    for m in list(PROGRAM_RE.finditer(code)) + list(RUN_MAIN_RE.finditer(code)):
        before = code[:m.start()]
        words = before.replace(";", " ; ").split()
        while words and re.match(r"^[A-Za-z_]\w*=\S*$", words[-1]):  # VAR=value settings of the command
            words.pop()
        if not words or words[-1] in (";", "|", "&&", "||", "do", "then") or "mpirun" in words:
            return True
    return False


def rewrite(line):
    """The programs by bare name (the wrappers on PATH); scripts/run-main.sh as `run-main.sh`."""
    line = PROGRAM_RE.sub(lambda m: m.group(1), line)
    return RUN_MAIN_RE.sub("run-main.sh", line)


TRAIN_WRAPPER = r'''#!/usr/bin/env python3
# A few steps of {prog}: every flag of the command is kept, the lengths are shortened.
import os, sys
args = sys.argv[1:]
steps = "3" if "--resume" in args else "2"
out = []
i = 0
while i < len(args):
    a = args[i]
    if a in ("--steps", "--eval-every", "--save-every") and i + 1 < len(args):
        out += [a, steps if a == "--steps" else "1"]
        i += 2
        continue
    out.append(a)
    i += 1
if "--steps" not in out and not any(a in ("--help", "-h") for a in out):
    out += ["--steps", steps]
print("docs test runs:", {prog!r}, " ".join(out), flush=True)
os.execv({path!r}, [{path!r}] + out)
'''

PLAIN_WRAPPER = '''#!/bin/sh
exec {path!r} "$@"
'''

MPIRUN_WRAPPER = r'''#!/usr/bin/env python3
# mpirun [options] PROGRAM ARGS: PROGRAM on the threads backend (its --backend mpi dropped).
import os, sys
args = sys.argv[1:]
i = 0
while i < len(args) and args[i].startswith("-"):
    i += 2 if args[i] in ("-n", "-np", "-c", "--host", "-H", "--map-by", "--bind-to", "-x", "--hostfile") else 1
prog, rest = args[i], args[i + 1:]
out = []
j = 0
while j < len(rest):
    if rest[j] == "--backend" and j + 1 < len(rest) and rest[j + 1] == "mpi":
        j += 2
        continue
    out.append(rest[j])
    j += 1
os.execvp(os.path.basename(prog), [os.path.basename(prog)] + out)
'''

SKIP_WRAPPER = '''#!/bin/sh
echo "docs test: {prog} was not built here (skipped)"
exit 77
'''

NO_GPU_WRAPPER = '''#!/bin/sh
echo "docs test: {prog} needs a GPU and this machine has none (skipped)"
exit 77
'''


def has_gpu():
    """Whether a GPU is usable here (nvidia-smi lists one): train_gpt_cuda's commands need it."""
    smi = shutil.which("nvidia-smi")
    if not smi:
        return False
    r = subprocess.run([smi, "-L"], capture_output=True, text=True)
    return r.returncode == 0 and "GPU" in r.stdout


def make_wrappers(dirpath, bindir, source):
    for prog in PROGRAMS:
        built = os.path.join(bindir, prog)
        if not os.path.exists(built):
            text = SKIP_WRAPPER.format(prog=prog)
        elif prog == "train_gpt_cuda" and not has_gpu():
            text = NO_GPU_WRAPPER.format(prog=prog)
        elif prog.startswith("train_gpt"):
            text = TRAIN_WRAPPER.format(prog=prog, path=built)
        else:
            text = PLAIN_WRAPPER.format(path=built)
        write_exec(os.path.join(dirpath, prog), text)
    write_exec(os.path.join(dirpath, "mpirun"), MPIRUN_WRAPPER)
    # The script itself, its trainer the wrapper above (no set-up, no build of its own).
    write_exec(os.path.join(dirpath, "run-main.sh"),
               '#!/bin/sh\nmkdir -p build-main\nDTENSOR_MAIN_TRAINER="{w}/train_gpt" DTENSOR_MAIN_BUILD="$PWD/build-main" '
               'exec {s}/scripts/run-main.sh "$@"\n'.format(w=dirpath, s=source))


def clip(text, keep=4000):
    """The start (where an error is named) and the end (where it stopped) of a long output."""
    return text if len(text) <= 2 * keep else text[:keep] + "\n[...]\n" + text[-keep:]


def write_exec(path, text):
    with open(path, "w") as f:
        f.write(text)
    os.chmod(path, 0o755)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--source", required=True)
    ap.add_argument("--bin", required=True, help="the folder of the built examples")
    ap.add_argument("--cxx", required=True)
    ap.add_argument("--work", default=None)
    ap.add_argument("--timeout", type=int, default=240)
    ap.add_argument("files", nargs="*")
    a = ap.parse_args()
    source = os.path.abspath(a.source)
    files = a.files or sorted(glob.glob(os.path.join(source, "docs", "*.md"))) + [os.path.join(source, "README.md")]
    work = a.work or tempfile.mkdtemp(prefix="dtensor-docs-")
    shutil.rmtree(work, ignore_errors=True)
    wrappers = os.path.join(work, "bin")
    os.makedirs(wrappers)
    make_wrappers(wrappers, os.path.abspath(a.bin), source)
    env = dict(os.environ, PATH=wrappers + os.pathsep + os.environ.get("PATH", ""), DTENSOR_PROGRESS="lines")
    failures, ran, compiled, skipped = [], 0, 0, 0
    for path in files:
        name = os.path.relpath(path, source)
        cwd = os.path.join(work, re.sub(r"\W", "_", name))
        os.makedirs(cwd, exist_ok=True)
        for line_no, lang, markers, body in fenced_blocks(path):
            if lang in ("cpp", "c++") and "complete" in markers:
                snippet = os.path.join(cwd, f"snippet_{line_no}.cpp")
                with open(snippet, "w") as f:
                    f.write(f'#line 1 "{name}:{line_no + 1}"\n' + "\n".join(body) + "\n")
                cmd = [a.cxx, "-std=c++20", "-fsyntax-only", "-I", os.path.join(source, "include"), snippet]
                start = time.monotonic()
                r = subprocess.run(cmd, capture_output=True, text=True)
                compiled += 1
                print(f"{name}:{line_no}: compile the complete snippet: {'ok' if r.returncode == 0 else 'FAILED'}"
                      f" ({time.monotonic() - start:.1f} s)")
                if r.returncode != 0:
                    failures.append(f"{name}:{line_no}: the snippet marked complete does not compile:\n{clip(r.stderr)}")
                continue
            if lang not in SHELL_TAGS or "no-run" in markers:
                continue
            for k, line in shell_lines(body):
                if not runs_a_program(line):
                    continue
                cmd = rewrite(line)
                where = f"{name}:{line_no + 1 + k}"
                if "--backend nccl" in line:  # a GPU per process under an MPI launcher: a GPU cluster's
                    skipped += 1
                    print(f"{where}: {line.strip()}\n  skipped: needs one GPU per rank (NCCL)")
                    continue
                start = time.monotonic()
                try:
                    r = subprocess.run(["bash", "-o", "pipefail", "-c", cmd], cwd=cwd, env=env, capture_output=True,
                                       text=True, timeout=a.timeout)
                    status, output = r.returncode, r.stdout + r.stderr
                except subprocess.TimeoutExpired as e:
                    status, output = "timeout", str(e.stdout or "") + str(e.stderr or "")
                if status == 77:
                    skipped += 1
                    print(f"{where}: {line.strip()}\n  skipped: {output.strip()}")
                    continue
                ran += 1
                took = time.monotonic() - start  # CI's time: the slow commands are named in the output
                print(f"{where}: {line.strip()}\n  {'ok' if status == 0 else 'FAILED (' + str(status) + ')'} ({took:.1f} s)")
                if status != 0:
                    failures.append(f"{where}: `{line.strip()}` exited with {status}:\n{clip(output)}")
    print(f"\ndocs test: {ran} commands run, {skipped} skipped (not built or no GPU here), {compiled} snippets compiled, "
          f"{len(failures)} failed")
    for f in failures:
        print("\nFAILED " + f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
