#!/usr/bin/env bash
# scripts/fetch-cudnn-frontend.sh — the cudnn-frontend headers (NVIDIA's header-only C++ graph API
# over cuDNN 9, MIT licence) for kernels/cuda/attention_cudnn.cuh, where the CUDA toolkit is here.
#
#   scripts/fetch-cudnn-frontend.sh [DIR]    # default: ${DTENSOR_DEPS_DIR:-~/.cache/dtensor}/cudnn-frontend
#
# Debian has no package of it; its PyPI wheel carries the headers (include/). One pinned release,
# checked by its SHA-256, unpacked into DIR/include, where cmake/FindCUDNN.cmake looks. Nothing is
# installed system-wide. Without nvcc (no CUDA build) or without network it says so and exits 0:
# the CUDA build then runs attention without cuDNN (the cuBLAS chunks; docs/gpu.md).
set -euo pipefail
version=1.32.0
sha=c6006556017a4d1c914c52a556c71b1267f2d6a0500f742e7b4edef539878df0
url=https://files.pythonhosted.org/packages/11/02/660e2dd9f9d9f940e1641443771730612c3aadaafbc5ef7a93cc313d519d/nvidia_cudnn_frontend-$version-cp311-cp311-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl
dir=${1:-${DTENSOR_DEPS_DIR:-$HOME/.cache/dtensor}/cudnn-frontend}
if [[ -f $dir/include/cudnn_frontend.h && -f $dir/VERSION && $(cat "$dir/VERSION") == "$version" ]]; then
  echo "fetch-cudnn-frontend: $version already in $dir"; exit 0
fi
if ! command -v nvcc >/dev/null && [[ ! -x /usr/local/cuda/bin/nvcc ]]; then
  echo "fetch-cudnn-frontend: no CUDA toolkit here: not needed"; exit 0
fi
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
if ! curl -fsSL --retry 3 -o "$tmp/fe.whl" "$url"; then
  echo "fetch-cudnn-frontend: could not download $url: the CUDA build goes without cuDNN attention" >&2; exit 0
fi
echo "$sha  $tmp/fe.whl" | sha256sum -c --quiet - || { echo "fetch-cudnn-frontend: checksum mismatch" >&2; exit 1; }
python3 - "$tmp/fe.whl" "$tmp/x" <<'PY'
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    z.extractall(sys.argv[2], [n for n in z.namelist() if n.startswith("include/")])
PY
rm -rf "$dir"; mkdir -p "$dir"; mv "$tmp/x/include" "$dir/include"; echo "$version" > "$dir/VERSION"
echo "fetch-cudnn-frontend: cudnn-frontend $version headers in $dir/include"
