"""Random-weight GGUF models at the shapes of real ones, quantized by llama.cpp's own ``llama-quantize``.

For memory, load time, ms/token and the cost of a forward pass at real sizes (Llama 3.1 8B, Qwen 2.5
7B...) without real weights; text from random weights means nothing, so never acceptance or speed-ups.
``real_shape_gguf(shape, quant)`` (CLI: ``python -m draftgate.bench.real_shapes SHAPE``):

1. writes an F16 GGUF of the shape (a name in ``modelinfo.shapes.NAMED_SHAPES`` or any ``ModelConfig``)
   with the ``gguf`` package, streaming: every tensor's info first, then each tensor drawn in float32
   chunks of rows from its own seeded generator, stored F16 (norms F32 1.0 and biases F32, as
   llama.cpp's converter stores 1-D tensors), written and freed before the next is made: peak memory
   is about one tensor in F16 (the embedding, 1 GB at 8B). Metadata: architecture (the family's name;
   Mistral as ``llama``, as llama.cpp writes it), context length, heads, KV heads, key/value length,
   RoPE base (Llama 3.x's frequency scaling as llama.cpp's ``rope_freqs`` tensor), RMS epsilon,
   feed-forward length, block count, Gemma 3's sliding window. The tokenizer is the bundled SmolLM2's
   (GPT-2 BPE, merges, bos/eos, chat template), padded to the shape's vocabulary with unused control
   tokens ``<|reserved_N|>`` (or cut to it with the merges of the tokens cut), so the embedding and
   output have the real shape. llama.cpp's ``llama`` architecture expects q/k rows in its converter's
   permuted order; for random weights the order does not matter, so none is applied.
2. quantizes it with ``llama-quantize`` (beside ``llama-server`` in the virtualenv ``make llamacpp``
   builds, or ``$DRAFTGATE_LLAMA_QUANTIZE``), unless ``quant`` is F16.
3. caches it as ``<cache>/real-shapes/<shape>-<quant>-<key>.gguf`` (``key`` hashes ``FORMAT_VERSION``
   and the shape); a second call returns it at once. Files are written under temporary names in the
   same folder; the F16 intermediate is deleted after quantizing, partial files on failure.

The CLI prints progress on stderr, then the file's size and, as the last stdout line, its path.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import os
import resource
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from draftgate.errors import DraftGateError
from draftgate.modelinfo.shapes import NAMED_SHAPES
from draftgate.models.config import ModelConfig, rope_inv_freq
from draftgate.paths import default_cache_dir

__all__ = [
    "ENV_QUANTIZE",
    "QUANT_TYPES",
    "RealShape",
    "RealShapeError",
    "cache_path",
    "find_llama_quantize",
    "real_shape_gguf",
    "tensor_plan",
    "write_f16_gguf",
]

FORMAT_VERSION = 1  # bump when the written file changes (names, metadata, weights): it keys the cache
ENV_QUANTIZE = "DRAFTGATE_LLAMA_QUANTIZE"
# llama-quantize's types that need no importance matrix; F16 skips llama-quantize.
QUANT_TYPES = (
    "Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 Q2_K Q3_K_S Q3_K_M Q3_K_L Q4_K_S Q4_K_M Q5_K_S Q5_K_M Q6_K IQ4_NL IQ4_XS BF16 F16"
).split()
SEED = 0
WEIGHT_STD = 0.02
BIAS_STD = 0.02
CHUNK_ELEMS = 1 << 24  # float32 elements generated at a time (64 MB)
PROGRESS_EVERY_S = 10.0
_GGUF_ARCH = {"mistral": "llama"}  # family -> llama.cpp's architecture name, where they differ
_MIN_VOCAB = 273  # SmolLM2's 17 special tokens and 256 byte tokens: a cut vocabulary keeps them


class RealShapeError(DraftGateError):
    """A random-weight file cannot be made (unknown shape, no llama-quantize, no disk space...)."""


@dataclass(frozen=True)
class TensorSpec:
    """One tensor of the file: GGUF name, numpy shape ([out, in] for a matrix), and how it is filled."""

    name: str
    shape: tuple[int, ...]
    kind: str  # "weight" (F16, normal), "norm" (F32 ones), "bias" (F32, normal), "rope" (F32 RoPE factors)

    @property
    def dtype(self) -> type[np.floating[Any]]:
        return np.float16 if self.kind == "weight" else np.float32

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape)) * np.dtype(self.dtype).itemsize


@dataclass(frozen=True)
class RealShape:
    """A made (or cached) file: its path and size; seconds per step ({} when it came from the cache)."""

    path: Path
    size: int
    cached: bool
    seconds: dict[str, float] = field(default_factory=dict)
    writer_peak_rss: int | None = None  # bytes: this process's peak RSS after writing the F16 file


def tensor_plan(cfg: ModelConfig) -> Iterator[TensorSpec]:
    """Every tensor of a ``cfg`` GGUF file, in llama.cpp's names, made lazily (the specs, never data)."""
    C, F, D, fam = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim, cfg.family
    q, kv = cfg.num_heads * D, cfg.num_kv_heads * D
    yield TensorSpec("token_embd.weight", (cfg.vocab_size, C), "weight")
    if cfg.rope_scaling is not None and cfg.rope_scaling.kind == "llama3":
        yield TensorSpec("rope_freqs.weight", (D // 2,), "rope")
    for i in range(cfg.num_layers):
        b = f"blk.{i}."
        yield TensorSpec(b + "attn_norm.weight", (C,), "norm")
        yield from (TensorSpec(b + f"attn_{p}.weight", (n, C), "weight") for p, n in (("q", q), ("k", kv), ("v", kv)))
        if fam.qkv_bias:
            yield from (TensorSpec(b + f"attn_{p}.bias", (n,), "bias") for p, n in (("q", q), ("k", kv), ("v", kv)))
        if fam.qk_norm:
            yield from (TensorSpec(b + f"attn_{p}_norm.weight", (D,), "norm") for p in "qk")
        yield TensorSpec(b + "attn_output.weight", (C, q), "weight")
        if fam.sandwich_norms:
            yield TensorSpec(b + "post_attention_norm.weight", (C,), "norm")
        yield TensorSpec(b + "ffn_norm.weight", (C,), "norm")
        yield from (TensorSpec(b + f"ffn_{p}.weight", (F, C), "weight") for p in ("gate", "up"))
        yield TensorSpec(b + "ffn_down.weight", (C, F), "weight")
        if fam.sandwich_norms:
            yield TensorSpec(b + "post_ffw_norm.weight", (C,), "norm")
    yield TensorSpec("output_norm.weight", (C,), "norm")
    if not cfg.tie_word_embeddings:
        yield TensorSpec("output.weight", (cfg.vocab_size, C), "weight")


def make_tensor(spec: TensorSpec, index: int, cfg: ModelConfig, chunk_elems: int = CHUNK_ELEMS) -> np.ndarray:
    """Tensor ``index`` of the plan: drawn in float32 chunks of rows from generator (SEED, index)."""
    if spec.kind == "norm":
        return np.ones(spec.shape, np.float32)
    if spec.kind == "rope":
        return _rope_factors(cfg)
    rng = np.random.default_rng([SEED, index])
    out = np.empty(spec.shape, spec.dtype)
    rows = out.reshape(spec.shape[0], -1)
    step = max(1, chunk_elems // rows.shape[1])
    std = WEIGHT_STD if spec.kind == "weight" else BIAS_STD
    for r in range(0, rows.shape[0], step):
        chunk = rng.standard_normal((min(step, rows.shape[0] - r), rows.shape[1]), dtype=np.float32)
        chunk *= std
        rows[r : r + step] = chunk  # cast to F16 for weights
    return out


def _rope_factors(cfg: ModelConfig) -> np.ndarray:
    """llama.cpp's rope_freqs: each frequency's divisor under the shape's Llama 3 scaling."""
    scaled = rope_inv_freq(cfg)
    base = rope_inv_freq(replace(cfg, rope_scaling=None))
    return (base / scaled).numpy().astype(np.float32)


@functools.lru_cache(maxsize=1)
def _smollm2_tokenizer() -> tuple[tuple[str, Any, Any, Any], ...]:
    """The bundled SmolLM2 file's ``tokenizer.*`` fields: (key, value, value type, element type)."""
    from gguf import GGUFReader

    from draftgate.models.known import known_model_path

    out = []
    for key, f in GGUFReader(known_model_path("smollm2-135m")).fields.items():
        if key.startswith("tokenizer."):
            sub = f.types[1] if len(f.types) > 1 else None
            out.append((key, f.contents(), f.types[0], sub))
    return tuple(out)


def _add_tokenizer(w: Any, vocab: int) -> None:
    """SmolLM2's tokenizer fields, its vocabulary padded (or cut) to ``vocab`` tokens."""
    import gguf

    fields = {k: (v, t, s) for k, v, t, s in _smollm2_tokenizer()}
    tokens, types = list(fields["tokenizer.ggml.tokens"][0]), list(fields["tokenizer.ggml.token_type"][0])
    if vocab < _MIN_VOCAB:
        raise RealShapeError(
            f"vocabulary {vocab} is below {_MIN_VOCAB}, the SmolLM2 tokenizer's special and byte tokens"
        )
    if vocab >= len(tokens):
        tokens += [f"<|reserved_{i}|>" for i in range(vocab - len(tokens))]
        types += [int(gguf.TokenType.CONTROL)] * (vocab - len(types))
    else:  # keep the merges whose pieces and result are all kept
        tokens, types = tokens[:vocab], types[:vocab]
        kept = set(tokens)
        merges = [m for m in fields["tokenizer.ggml.merges"][0] if set(m.split(" ")) | {m.replace(" ", "")} <= kept]
        fields["tokenizer.ggml.merges"] = (merges, *fields["tokenizer.ggml.merges"][1:])
    fields["tokenizer.ggml.tokens"] = (tokens, *fields["tokenizer.ggml.tokens"][1:])
    fields["tokenizer.ggml.token_type"] = (types, *fields["tokenizer.ggml.token_type"][1:])
    for key, (value, vtype, sub) in fields.items():
        w.add_key_value(key, value, vtype, sub_type=sub)


def _add_metadata(w: Any, cfg: ModelConfig, name: str) -> None:
    import gguf

    w.add_name(name)
    w.add_description("random weights at a real model's shape (draftgate.bench.real_shapes): its text means nothing")
    w.add_file_type(1)  # LLAMA_FTYPE_MOSTLY_F16
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_block_count(cfg.num_layers)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_heads)
    w.add_head_count_kv(cfg.num_kv_heads)
    w.add_key_length(cfg.head_dim)
    w.add_value_length(cfg.head_dim)
    w.add_rope_dimension_count(cfg.head_dim)
    w.add_rope_freq_base(cfg.rope_theta)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_vocab_size(cfg.vocab_size)
    rs = cfg.rope_scaling
    if rs is not None and rs.kind == "linear":
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(rs.factor)
    if any(cfg.layer_windows):
        w.add_sliding_window(max(cfg.layer_windows))
    if cfg.rope_local_theta is not None:
        w.add_key_value(f"{w.arch}.rope.freq_base_swa", cfg.rope_local_theta, gguf.GGUFValueType.FLOAT32)


def write_f16_gguf(cfg: ModelConfig, path: Path, name: str = "custom", chunk_elems: int = CHUNK_ELEMS) -> int:
    """Write a random-weight F16 GGUF file of ``cfg`` at ``path``, one tensor in memory at a time; its size."""
    import gguf

    total = sum(s.nbytes for s in tensor_plan(cfg))
    w = gguf.GGUFWriter(str(path), _GGUF_ARCH.get(cfg.family.name, cfg.family.name))
    try:
        _add_metadata(w, cfg, name)
        _add_tokenizer(w, cfg.vocab_size)
        for s in tensor_plan(cfg):
            w.add_tensor_info(s.name, s.shape, np.dtype(s.dtype), s.nbytes)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_ti_data_to_file()
        t0 = last = time.monotonic()
        done = 0
        for i, s in enumerate(tensor_plan(cfg)):
            w.write_tensor_data(make_tensor(s, i, cfg, chunk_elems))  # the array is freed on return
            done += s.nbytes
            if time.monotonic() - last >= PROGRESS_EVERY_S or done == total:
                last = time.monotonic()
                _log(f"writing {name} F16: {_gb(done)} of {_gb(total)} ({100 * done / total:.0f}%), {last - t0:.0f} s")
    finally:
        w.close()
    return path.stat().st_size


def _log(msg: str) -> None:
    print(f"real_shapes: {msg}", file=sys.stderr, flush=True)


def _gb(n: int) -> str:
    return f"{n / 1e9:.2f} GB"


def find_llama_quantize() -> Path:
    """``$DRAFTGATE_LLAMA_QUANTIZE``, else ``llama-quantize`` beside the ``llama-server`` that
    ``bench.llama_server.find_llama_server`` finds; RealShapeError naming `make llamacpp` if there is none."""
    from draftgate.bench.arm_spec import ArmError
    from draftgate.bench.llama_server import find_llama_server

    given = os.environ.get(ENV_QUANTIZE)
    if given:
        if not (Path(given).is_file() and os.access(given, os.X_OK)):
            raise RealShapeError(f"${ENV_QUANTIZE}={given} is not an executable file; unset it or run `make llamacpp`")
        return Path(given)
    try:
        server = find_llama_server()
    except ArmError as e:
        raise RealShapeError(f"llama.cpp's llama-quantize is not installed: run `make llamacpp` ({e})") from None
    exe = server.with_name("llama-quantize")
    if not (exe.is_file() and os.access(exe, os.X_OK)):
        raise RealShapeError(f"no llama-quantize beside {server}: rebuild with `make llamacpp`")
    return exe


def _quantize(exe: Path, src: Path, dst: Path, quant: str, threads: int | None) -> None:
    """Run llama-quantize, its output on stderr; RealShapeError with its last lines if it fails."""
    cmd = [str(exe), str(src), str(dst), quant] + ([str(threads)] if threads else [])
    _log("running " + " ".join(cmd))
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace")
    assert proc.stdout is not None
    tail: list[str] = []
    for line in proc.stdout:
        sys.stderr.write(line)
        tail = (tail + [line.rstrip()])[-8:]
    if proc.wait() != 0:
        raise RealShapeError(f"llama-quantize exited with status {proc.returncode}:\n" + "\n".join(tail))


def cache_path(cfg: ModelConfig, name: str, quant: str, out_dir: Path) -> Path:
    """Where the ``quant`` file of shape ``cfg`` (called ``name``) is cached in ``out_dir``."""
    key = hashlib.sha256(f"{FORMAT_VERSION}\n{cfg!r}".encode()).hexdigest()[:12]
    return out_dir / f"{name}-{quant}-{key}.gguf"


def default_out_dir() -> Path:  # $DRAFTGATE_CACHE as bench.llama_server reads it, else ~/.cache/draftgate
    return Path(os.environ.get("DRAFTGATE_CACHE") or default_cache_dir()) / "real-shapes"


def real_shape_gguf(
    shape: str | ModelConfig,
    quant: str = "Q4_K_M",
    out_dir: Path | None = None,
    *,
    name: str | None = None,
    threads: int | None = None,
) -> RealShape:
    """The cached random-weight ``quant`` GGUF file of ``shape`` (a NAMED_SHAPES name or a ModelConfig),
    made if missing (see the module's docstring)."""
    if isinstance(shape, str):
        cfg = NAMED_SHAPES.get(shape.strip().lower())
        if cfg is None:
            raise RealShapeError(f"unknown shape {shape!r}; named shapes: {', '.join(NAMED_SHAPES)}")
        name = name or shape.strip().lower()
    else:
        cfg, name = shape, name or "custom"
    quant = quant.upper()
    if quant not in QUANT_TYPES:
        raise RealShapeError(f"quantization {quant!r} is not one of {', '.join(QUANT_TYPES)}")
    out_dir = Path(out_dir) if out_dir is not None else default_out_dir()
    final = cache_path(cfg, name, quant, out_dir)
    if final.is_file():
        return RealShape(final, final.stat().st_size, cached=True)
    exe = find_llama_quantize() if quant != "F16" else None  # before writing gigabytes
    out_dir.mkdir(parents=True, exist_ok=True)
    out_share = {"F16": 0.0, "BF16": 1.0, "Q8_0": 0.55}.get(quant, 0.45)  # the output beside the F16 file
    need = sum(s.nbytes for s in tensor_plan(cfg)) * (1 + out_share)
    free = shutil.disk_usage(out_dir).free
    if free < need:
        raise RealShapeError(f"{out_dir} has {_gb(free)} free; making {final.name} needs about {_gb(int(need))}")
    f16 = final.with_name(f".{final.stem}.f16.partial")
    part = final.with_name(f".{final.stem}.partial")
    seconds: dict[str, float] = {}
    peak = None
    try:
        t0 = time.monotonic()
        write_f16_gguf(cfg, f16, name)
        seconds["write_f16"] = time.monotonic() - t0
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        _log(f"F16 file {_gb(f16.stat().st_size)} written in {seconds['write_f16']:.1f} s; peak RSS {_gb(peak)}")
        if exe is None:
            f16.replace(final)
        else:
            t0 = time.monotonic()
            _quantize(exe, f16, part, quant, threads)
            seconds["quantize"] = time.monotonic() - t0
            part.replace(final)
            _log(f"{quant} file {_gb(final.stat().st_size)} made in {seconds['quantize']:.1f} s")
    finally:
        f16.unlink(missing_ok=True)
        part.unlink(missing_ok=True)
    return RealShape(final, final.stat().st_size, cached=False, seconds=seconds, writer_peak_rss=peak)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m draftgate.bench.real_shapes",
        description=(
            "Write a random-weight GGUF model at a real model's shape and quantize it with llama.cpp's "
            "llama-quantize (`make llamacpp` builds it), cached. For memory, load time, ms/token and pass "
            "cost at real sizes only: random weights make meaningless text, so never measure acceptance "
            "or speculative speed-ups with it. Progress goes to stderr; the size and, last, the path to stdout."
        ),
    )
    p.add_argument(
        "shape",
        type=str.lower,
        choices=sorted(NAMED_SHAPES),
        metavar="SHAPE",
        help="one of: " + ", ".join(NAMED_SHAPES),
    )
    q = ", ".join(QUANT_TYPES)
    p.add_argument("--quant", default="Q4_K_M", type=str.upper, choices=QUANT_TYPES, metavar="QUANT", help=q)
    p.add_argument("--out", type=Path, default=None, help=f"cache folder (default {default_out_dir()})")
    p.add_argument("--threads", type=int, default=None, help="llama-quantize's threads (default: its own)")
    args = p.parse_args(argv)
    try:
        made = real_shape_gguf(args.shape, args.quant, args.out, threads=args.threads)
    except RealShapeError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    _log(f"cached: {made.path}" if made.cached else f"made {made.path}")
    print(f"size: {made.size} bytes ({_gb(made.size)})")
    print(made.path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
