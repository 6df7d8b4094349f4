"""The shape of a decoder model, read from GGUF metadata or an HF config.json, and what its family
changes in the forward (``Family``, one row per architecture in ``FAMILIES``).

The forward (native and PyTorch) reads typed properties, never a family's name: q/k/v biases,
per-head q/k norms, norms around the attention and the MLP, the MLP's activation, scaled
embeddings, per-layer attention windows and a local RoPE base. Any architecture not in
``FAMILIES`` is refused at load with its name and the supported list.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch

__all__ = ["Family", "FAMILIES", "HF_MODEL_TYPES", "ModelConfig", "RopeScaling", "family_of", "rope_inv_freq"]


@dataclass(frozen=True)
class Family:
    """What an architecture changes in the forward; the loaders read the rest from the files."""

    name: str
    qkv_bias: bool = False  # q, k and v projections add a bias (Qwen 2)
    qk_norm: bool = False  # per-head RMSNorm of q and k before RoPE (Qwen 3, Gemma 3)
    sandwich_norms: bool = False  # the attention's and the MLP's outputs are normed before the residual (Gemma 3)
    gelu: bool = False  # the MLP's gate is GELU, tanh approximation (Gemma); else SiLU
    embed_scale: bool = False  # embeddings are scaled by sqrt(hidden size) (Gemma)
    norm_offset: float = 0.0  # HF checkpoints store RMSNorm weights as w - offset (Gemma: 1); folded in at load
    gguf_permuted_qk: bool = False  # llama.cpp's converter permuted q/k rows (its llama arch): unpermuted at load

    @property
    def layer_weights(self) -> tuple[str, ...]:
        """Every tensor of a layer, runner names without "model.layers.{i}." (HF Llama's, plus the norms
        the family adds: ``self_attn.o_norm`` and ``mlp.down_norm`` are Gemma's post-attention and
        post-feedforward norms; its pre-feedforward norm is ``post_attention_layernorm``, as Llama's)."""
        names = ["input_layernorm.weight", "post_attention_layernorm.weight"]
        names += [f"self_attn.{p}_proj.weight" for p in "qkvo"] + [
            f"mlp.{p}_proj.weight" for p in ("gate", "up", "down")
        ]
        if self.qkv_bias:
            names += [f"self_attn.{p}_proj.bias" for p in "qkv"]
        if self.qk_norm:
            names += ["self_attn.q_norm.weight", "self_attn.k_norm.weight"]
        if self.sandwich_norms:
            names += ["self_attn.o_norm.weight", "mlp.down_norm.weight"]
        return tuple(names)


FAMILIES: dict[str, Family] = {
    f.name: f
    for f in (
        Family("llama", gguf_permuted_qk=True),
        Family("mistral", gguf_permuted_qk=True),
        Family("qwen2", qkv_bias=True),
        Family("qwen3", qk_norm=True),
        Family("gemma3", qk_norm=True, sandwich_norms=True, gelu=True, embed_scale=True, norm_offset=1.0),
    )
}
# An HF config's model_type -> its family (GGUF's general.architecture names the family itself).
HF_MODEL_TYPES = {"llama": "llama", "mistral": "mistral", "qwen2": "qwen2", "qwen3": "qwen3", "gemma3_text": "gemma3"}


def family_of(name: str, where: str) -> Family:
    """The family of an architecture name, or ValueError naming it and the supported ones."""
    f = FAMILIES.get(name)
    if f is None:
        raise ValueError(f"{where}: unsupported architecture {name!r} (supported: {', '.join(FAMILIES)})")
    return f


@dataclass(frozen=True)
class RopeScaling:
    """RoPE frequency scaling. kind: "linear" or "llama3" (Llama 3.1 / 3.2 style)."""

    kind: str
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position: int = 8192


@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling | None = None
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = False
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    # Per-frequency divisors shipped in some GGUF files (llama.cpp's rope_freqs tensor).
    rope_freq_factors: tuple[float, ...] | None = field(default=None, repr=False)
    family: Family = FAMILIES["llama"]
    # Per layer, the keys a position attends: the last `window` positions (its own included), 0: all.
    # Empty: every layer attends all. Layers with a window use rope_local_theta where it is set.
    layer_windows: tuple[int, ...] = ()
    rope_local_theta: float | None = None
    attn_scale: float | None = None  # scores are q.k times this (None: 1/sqrt(head_dim))

    def __post_init__(self) -> None:
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads {self.num_heads} is not a multiple of num_kv_heads {self.num_kv_heads}")
        if self.head_dim % 2:
            raise ValueError(f"head_dim must be even for RoPE, got {self.head_dim}")
        if self.layer_windows and len(self.layer_windows) != self.num_layers:
            raise ValueError(f"layer_windows has {len(self.layer_windows)} entries for {self.num_layers} layers")

    def window(self, layer: int) -> int:
        """Keys a position of this layer attends: the last ``window`` positions (0: all)."""
        return self.layer_windows[layer] if self.layer_windows else 0

    @property
    def scale(self) -> float:
        """The attention scores' scale."""
        return self.attn_scale if self.attn_scale is not None else 1.0 / math.sqrt(self.head_dim)

    @property
    def num_params(self) -> int:
        C, F, L, V, D = self.hidden_size, self.intermediate_size, self.num_layers, self.vocab_size, self.head_dim
        q_kv = D * (self.num_heads + 2 * self.num_kv_heads)
        fam = self.family
        norms = (4 if fam.sandwich_norms else 2) * C + (2 * D if fam.qk_norm else 0) + (q_kv if fam.qkv_bias else 0)
        per_layer = C * q_kv + self.num_heads * D * C + 3 * C * F + norms
        return V * C * (1 if self.tie_word_embeddings else 2) + L * per_layer + C

    @classmethod
    def from_hf(cls, cfg: dict[str, Any]) -> ModelConfig:
        kind = cfg.get("model_type", "?")
        if kind not in HF_MODEL_TYPES:
            arch = cfg.get("architectures") or [kind]
            raise ValueError(
                f"unsupported architecture {arch[0]!r} (model_type {kind!r}; supported: {', '.join(HF_MODEL_TYPES)})"
            )
        fam = FAMILIES[HF_MODEL_TYPES[kind]]
        heads = int(cfg["num_attention_heads"])
        hidden = int(cfg["hidden_size"])
        layers = int(cfg["num_hidden_layers"])
        eos = cfg.get("eos_token_id")
        eos_ids = tuple(eos) if isinstance(eos, list) else ((eos,) if eos is not None else ())
        global_rope, local_theta = _hf_rope(cfg)
        windows, local = _hf_windows(cfg, layers)
        return cls(
            vocab_size=int(cfg["vocab_size"]),
            hidden_size=hidden,
            intermediate_size=int(cfg["intermediate_size"]),
            num_layers=layers,
            num_heads=heads,
            num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
            head_dim=int(cfg.get("head_dim") or hidden // heads),
            rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-5)),
            rope_theta=float(global_rope.get("rope_theta", 10000.0)),
            rope_scaling=_hf_rope_scaling(global_rope),
            max_position_embeddings=int(cfg.get("max_position_embeddings", 2048)),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", fam.embed_scale)),
            bos_token_id=cfg.get("bos_token_id"),
            eos_token_ids=tuple(int(e) for e in eos_ids),
            family=fam,
            layer_windows=windows,
            rope_local_theta=local_theta if local else None,
            attn_scale=float(cfg["query_pre_attn_scalar"]) ** -0.5 if cfg.get("query_pre_attn_scalar") else None,
        )

    def to_hf(self) -> dict[str, Any]:
        """An HF LlamaConfig dict (used to save folders and to build parity references): Llama-family
        models only."""
        if self.family.name not in ("llama", "mistral") or self.layer_windows:
            raise ValueError(f"writing an HF folder of a {self.family.name} model is not supported (Llama only)")
        d: dict[str, Any] = {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "max_position_embeddings": self.max_position_embeddings,
            "tie_word_embeddings": self.tie_word_embeddings,
            "hidden_act": "silu",
            "attention_bias": False,
            "mlp_bias": False,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": list(self.eos_token_ids) if len(self.eos_token_ids) != 1 else self.eos_token_ids[0],
        }
        if self.rope_scaling is not None:
            rs = self.rope_scaling
            d["rope_scaling"] = {"rope_type": rs.kind, "factor": rs.factor}
            if rs.kind == "llama3":
                d["rope_scaling"].update(
                    low_freq_factor=rs.low_freq_factor,
                    high_freq_factor=rs.high_freq_factor,
                    original_max_position_embeddings=rs.original_max_position,
                )
        return d


def _hf_rope(cfg: dict[str, Any]) -> tuple[dict[str, Any], float]:
    """(the global layers' RoPE parameters, the local layers' RoPE base).

    transformers writes ``rope_parameters`` (one dict, or one per layer type: ``full_attention``,
    ``sliding_attention``); older configs ``rope_theta``, ``rope_scaling`` and Gemma 3's
    ``rope_local_base_freq``."""
    rp = cfg.get("rope_parameters") or {}
    if "full_attention" in rp or "sliding_attention" in rp:
        full = dict(rp.get("full_attention") or {})
        local = rp.get("sliding_attention") or full
        return full, float(local.get("rope_theta", full.get("rope_theta", 10000.0)))
    merged = dict(cfg.get("rope_scaling") or {})
    merged.update(rp)
    merged.setdefault("rope_theta", cfg.get("rope_theta") or 10000.0)
    return merged, float(cfg.get("rope_local_base_freq") or merged["rope_theta"])


def _hf_windows(cfg: dict[str, Any], layers: int) -> tuple[tuple[int, ...], bool]:
    """(per-layer attention windows, whether some layer is local). Sliding layers: ``layer_types``, or
    Gemma 3's ``sliding_window_pattern`` (every n-th layer global), or every layer where a Mistral-
    style ``sliding_window`` is set and not turned off (Qwen's ``use_sliding_window``)."""
    window = cfg.get("sliding_window")
    if not window or cfg.get("use_sliding_window") is False:
        return (), False
    types = cfg.get("layer_types")
    if types:
        local = [t == "sliding_attention" for t in types]
    elif cfg.get("sliding_window_pattern"):
        n = int(cfg["sliding_window_pattern"])
        local = [(i + 1) % n != 0 for i in range(layers)]
    else:
        local = [True] * layers
    if len(local) != layers:
        raise ValueError(f"layer_types has {len(local)} entries for {layers} layers")
    return tuple(int(window) if x else 0 for x in local), any(local)


def _hf_rope_scaling(rs: dict[str, Any] | None) -> RopeScaling | None:
    if not rs:
        return None
    kind = rs.get("rope_type") or rs.get("type")
    if kind in (None, "default"):
        return None
    if kind not in ("linear", "llama3"):
        raise ValueError(f"unsupported rope_scaling type {kind!r} (supported: linear, llama3)")
    return RopeScaling(
        kind=kind,
        factor=float(rs.get("factor", 1.0)),
        low_freq_factor=float(rs.get("low_freq_factor", 1.0)),
        high_freq_factor=float(rs.get("high_freq_factor", 4.0)),
        original_max_position=int(rs.get("original_max_position_embeddings", 8192)),
    )


def rope_inv_freq(cfg: ModelConfig, local: bool = False) -> torch.Tensor:
    """Inverse frequencies [head_dim // 2] with the model's scaling applied (``local``: of the layers
    with an attention window, at rope_local_theta and unscaled, where the model sets one).

    Computed in float32 the way transformers does, so RoPE angles match bit for bit.
    """
    D = cfg.head_dim
    if local and cfg.rope_local_theta is not None:
        return 1.0 / (cfg.rope_local_theta ** (torch.arange(0, D, 2, dtype=torch.int64).float() / D))  # [D/2]
    inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, D, 2, dtype=torch.int64).float() / D))  # [D/2]
    rs = cfg.rope_scaling
    if cfg.rope_freq_factors is not None:
        inv = inv / torch.tensor(cfg.rope_freq_factors, dtype=torch.float32)
    elif rs is not None and rs.kind == "linear":
        inv = inv / rs.factor
    elif rs is not None and rs.kind == "llama3":
        # Llama 3.1: keep high frequencies, divide low ones by factor, blend in between.
        low_wavelen = rs.original_max_position / rs.low_freq_factor
        high_wavelen = rs.original_max_position / rs.high_freq_factor
        wavelen = 2 * math.pi / inv
        smooth = (rs.original_max_position / wavelen - rs.low_freq_factor) / (rs.high_freq_factor - rs.low_freq_factor)
        blended = (1 - smooth) * inv / rs.factor + smooth * inv
        inv = torch.where(wavelen > low_wavelen, inv / rs.factor, inv)
        mid = (wavelen <= low_wavelen) & (wavelen >= high_wavelen)
        inv = torch.where(mid, blended, inv)
    return inv
