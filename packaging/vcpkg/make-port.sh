#!/usr/bin/env bash
# packaging/vcpkg/make-port.sh — the vcpkg port of dtensor stamped at one commit, in OUT/dtensor.
#
#   packaging/vcpkg/make-port.sh OUT [--ref COMMIT] [--url GIT_URL] [--homepage URL]
#   vcpkg install "dtensor[mpi]" --overlay-ports=OUT
#
# The port is packaging/vcpkg/ports/dtensor plus source.cmake, which names the git URL and the
# commit (a full 40-hex SHA) that vcpkg_from_git fetches. vcpkg hashes every file of a port into
# its ABI hash, so each commit gives another binary-cache key: a header change is never served
# from a stale cached package (the unstamped overlay port packages the checkout around it and
# cannot promise that). The manifest gets "homepage".
# Defaults: --ref HEAD of this checkout (refused when include/, cmake/ or CMakeLists.txt have
# uncommitted changes, which the commit would not contain); --url the checkout's `origin`
# remote, else this checkout as file:// (a local overlay); --homepage the URL when it is
# http(s), else this checkout's docs/consuming.md.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
usage() { echo "usage: $0 OUT [--ref COMMIT] [--url GIT_URL] [--homepage URL]" >&2; exit 2; }
[[ $# -ge 1 ]] || usage
OUT=$1
shift
ref="" url="" homepage=""
while [[ $# -gt 0 ]]; do
  case $1 in
    --ref) ref=${2:?--ref needs a commit}; shift 2 ;;
    --url) url=${2:?--url needs a git URL}; shift 2 ;;
    --homepage) homepage=${2:?--homepage needs a URL}; shift 2 ;;
    *) usage ;;
  esac
done
git -C "$ROOT" rev-parse --git-dir >/dev/null 2>&1 || { echo "make-port: $ROOT is not a git checkout" >&2; exit 1; }
if [[ -z $ref ]]; then
  if ! git -C "$ROOT" diff --quiet HEAD -- include cmake CMakeLists.txt; then
    echo "make-port: include/, cmake/ or CMakeLists.txt have uncommitted changes that HEAD does not hold;" \
         "commit them or pass --ref" >&2
    exit 1
  fi
  ref=HEAD
fi
sha=$(git -C "$ROOT" rev-parse --verify --quiet "$ref^{commit}") \
  || { echo "make-port: '$ref' is not a commit of $ROOT" >&2; exit 1; }
if [[ -z $url ]]; then url=$(git -C "$ROOT" remote get-url origin 2>/dev/null || echo "file://$ROOT"); fi
if [[ -z $homepage ]]; then
  if [[ $url == http://* || $url == https://* ]]; then homepage=${url%.git}; else homepage="file://$ROOT/docs/consuming.md"; fi
fi
port="$OUT/dtensor"
rm -rf "$port"
mkdir -p "$port"
cp "$ROOT"/packaging/vcpkg/ports/dtensor/{portfile.cmake,usage,vcpkg.json} "$port/"
cat >"$port/source.cmake" <<CMAKE
# Written by packaging/vcpkg/make-port.sh: the source of this port (vcpkg_from_git).
set(DTENSOR_GIT_URL "$url")
set(DTENSOR_GIT_REF "$sha")
CMAKE
# "homepage" after "description" (the manifest is ours: one key per line).
sed -i "s|^  \"description\": \(.*\),\$|  \"description\": \1,\n  \"homepage\": \"$homepage\",|" "$port/vcpkg.json"
grep -q '"homepage"' "$port/vcpkg.json" || { echo "make-port: could not add homepage to vcpkg.json" >&2; exit 1; }
echo "make-port: $port at $sha from $url"
