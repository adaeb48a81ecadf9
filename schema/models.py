"""The shape of a Llama-family model (Llama, Qwen2, Qwen3), read from an HF config.json.

Presets give real shapes without any file, for dummy-weight runs and cost models: the
engine builds its model from a ``ModelConfig`` and the simulator prices steps and sizes
its KV pages from the same one (``sim.costs.presets.model_shape``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from schema.sharding import head_partition

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")


@dataclass(frozen=True, slots=True)
class RopeScaling:
    """Rotary frequency scaling. ``rope_type`` is ``default`` or ``llama3`` (Llama 3.1)."""

    rope_type: str = "default"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192


@dataclass(frozen=True, slots=True)
class ModelConfig:
    """Shapes and numerical details of a decoder-only Llama-family transformer.

    ``qkv_bias``: q/k/v projections have a bias (Qwen2; Llama with ``attention_bias``).
    ``o_bias``: the output projection has one too (Llama ``attention_bias`` only).
    ``qk_norm``: per-head RMSNorm on q and k before rotary (Qwen3).
    """

    model_type: str
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling = field(default_factory=RopeScaling)
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = False
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False
    max_position_embeddings: int = 4096
    eos_token_ids: tuple[int, ...] = ()
    bos_token_id: int | None = None
    dtype: str = "bfloat16"

    def __post_init__(self) -> None:
        if self.model_type not in SUPPORTED_MODEL_TYPES:
            raise ValueError(
                f"unsupported model_type {self.model_type!r}; supported: {SUPPORTED_MODEL_TYPES}"
            )
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads "
                f"({self.num_kv_heads})"
            )

    @property
    def num_params(self) -> int:
        """Parameter count of the full model (tied embeddings counted once)."""
        h, d = self.hidden_size, self.head_dim
        attn = h * d * (self.num_heads * 2 + self.num_kv_heads * 2)
        mlp = 3 * h * self.intermediate_size
        per_layer = attn + mlp + 2 * h
        if self.qk_norm:
            per_layer += 2 * d
        if self.qkv_bias:
            per_layer += (self.num_heads + 2 * self.num_kv_heads) * d
        if self.o_bias:
            per_layer += h
        if self.mlp_bias:
            per_layer += 2 * self.intermediate_size + h
        embed = self.vocab_size * h * (1 if self.tie_word_embeddings else 2)
        return self.num_layers * per_layer + embed + h

    @property
    def layer_params(self) -> int:
        """Matmul parameters of one layer (norm weights and biases are negligible and left
        out): what a token's pass through the layer multiplies by."""
        h, d = self.hidden_size, self.head_dim
        q_o = 2 * h * self.num_heads * d
        k_v = 2 * h * self.num_kv_heads * d
        return q_o + k_v + 3 * h * self.intermediate_size

    @property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def weights_read_per_step(self) -> int:
        """Parameters a forward pass reads in full: every layer and the LM head. The input
        embedding is a row lookup, so only the LM head's copy of the vocabulary matrix counts
        (tied or not)."""
        return self.num_layers * self.layer_params + self.embedding_params

    def kv_bytes_per_token(self, dtype_bytes: float, tp_size: int = 1) -> float:
        """KV-cache bytes one token takes on the fullest rank of ``tp_size`` (K and V, all
        layers; ``schema.sharding`` splits the KV heads): the engine sizes its pool by it and
        the simulator its pages."""
        kv_local = max(
            head_partition(self.num_heads, self.num_kv_heads, tp_size, r).kv_count
            for r in range(tp_size)
        )
        return 2 * self.num_layers * kv_local * self.head_dim * dtype_bytes

    @staticmethod
    def from_hf(cfg: dict[str, Any]) -> ModelConfig:
        """Build from the dict of an HF config.json (transformers 4.x and 5.x keys)."""
        model_type = str(cfg.get("model_type", ""))
        num_heads = int(cfg["num_attention_heads"])
        hidden = int(cfg["hidden_size"])
        rope = dict(cfg.get("rope_parameters") or {})
        scaling_src = cfg.get("rope_scaling") or rope
        theta = float(cfg.get("rope_theta") or rope.get("rope_theta") or 10000.0)
        rope_type = str(scaling_src.get("rope_type", scaling_src.get("type", "default")))
        if rope_type not in ("default", "llama3"):
            raise ValueError(f"unsupported rope scaling type {rope_type!r}")
        scaling = RopeScaling(rope_type=rope_type)
        if rope_type == "llama3":
            scaling = RopeScaling(
                rope_type="llama3",
                factor=float(scaling_src["factor"]),
                low_freq_factor=float(scaling_src.get("low_freq_factor", 1.0)),
                high_freq_factor=float(scaling_src.get("high_freq_factor", 4.0)),
                original_max_position_embeddings=int(
                    scaling_src.get("original_max_position_embeddings", 8192)
                ),
            )
        attention_bias = bool(cfg.get("attention_bias", False))
        dtype = str(cfg.get("dtype") or cfg.get("torch_dtype") or "bfloat16")
        return ModelConfig(
            model_type=model_type,
            hidden_size=hidden,
            num_layers=int(cfg["num_hidden_layers"]),
            num_heads=num_heads,
            num_kv_heads=int(cfg.get("num_key_value_heads") or num_heads),
            head_dim=int(cfg.get("head_dim") or hidden // num_heads),
            intermediate_size=int(cfg["intermediate_size"]),
            vocab_size=int(cfg["vocab_size"]),
            rope_theta=theta,
            rope_scaling=scaling,
            rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            qkv_bias=model_type == "qwen2" or attention_bias,
            o_bias=model_type in ("llama", "mistral") and attention_bias,
            mlp_bias=bool(cfg.get("mlp_bias", False)),
            qk_norm=model_type == "qwen3",
            max_position_embeddings=int(cfg.get("max_position_embeddings", 4096)),
            eos_token_ids=token_ids(cfg.get("eos_token_id")),
            bos_token_id=cfg.get("bos_token_id"),
            dtype=dtype,
        )

    def to_hf(self) -> dict[str, Any]:
        """The HF config.json keys of this config (``from_hf`` reads them back)."""
        s = self.rope_scaling
        rope: dict[str, Any] = {"rope_type": s.rope_type, "rope_theta": self.rope_theta}
        if s.rope_type == "llama3":
            rope |= {
                "factor": s.factor,
                "low_freq_factor": s.low_freq_factor,
                "high_freq_factor": s.high_freq_factor,
                "original_max_position_embeddings": s.original_max_position_embeddings,
            }
        out: dict[str, Any] = {
            "model_type": self.model_type,
            "hidden_size": self.hidden_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "intermediate_size": self.intermediate_size,
            "vocab_size": self.vocab_size,
            "max_position_embeddings": self.max_position_embeddings,
            "rms_norm_eps": self.rms_norm_eps,
            "tie_word_embeddings": self.tie_word_embeddings,
            "rope_parameters": rope,
            "mlp_bias": self.mlp_bias,
            "eos_token_id": list(self.eos_token_ids) or None,
            "bos_token_id": self.bos_token_id,
            "dtype": self.dtype,
        }
        if self.model_type in ("llama", "mistral"):
            out["attention_bias"] = self.qkv_bias
        return out

    @staticmethod
    def from_dir(path: str | Path) -> ModelConfig:
        """Read ``config.json`` (and the EOS ids of ``generation_config.json``) of a folder."""
        folder = Path(path)
        config_file = folder / "config.json"
        if not config_file.is_file():
            raise FileNotFoundError(f"no config.json in {folder}")
        config = ModelConfig.from_hf(json.loads(config_file.read_text()))
        return replace(config, eos_token_ids=read_eos_token_ids(folder))


def token_ids(value: Any) -> tuple[int, ...]:
    """The ids of a config's ``eos_token_id``: one id, a list of ids, or None."""
    return tuple(int(e) for e in (value if isinstance(value, list) else [value]) if e is not None)


def read_eos_token_ids(folder: str | Path) -> tuple[int, ...]:
    """The EOS ids of an HF folder: ``config.json``'s, then ``generation_config.json``'s."""
    ids: list[int] = []
    for name in ("config.json", "generation_config.json"):
        file = Path(folder) / name
        if file.is_file():
            ids += token_ids(json.loads(file.read_text()).get("eos_token_id"))
    return tuple(dict.fromkeys(ids))


Shape = tuple[int, int, int, int, int, int, int, int]
"""hidden, layers, heads, kv heads, head dim, intermediate, vocab, max positions."""

_QWEN = {"rope_theta": 1000000.0, "tie_word_embeddings": True, "eos_token_ids": (151645, 151643)}

FAMILIES: dict[str, dict[str, Any]] = {
    "llama": {"rope_theta": 500000.0, "rms_norm_eps": 1e-5},
    "qwen2": {**_QWEN, "qkv_bias": True},
    "qwen3": {**_QWEN, "qk_norm": True},
}
"""What a family sets besides the shape (``llama`` here is Llama 3.x)."""

_TOY = {"eos_token_ids": (2,), "dtype": "float32"}
"""The two-layer toys: float32 for exact CPU tests, EOS id 2 of a 512-token vocabulary."""


def _preset(model_type: str, shape: Shape, **details: Any) -> ModelConfig:
    """A preset of ``model_type``'s family with ``shape``; ``details`` override the family's."""
    family = FAMILIES[model_type]
    return ModelConfig(
        model_type, *shape[:-1], **{**family, "max_position_embeddings": shape[-1], **details}
    )


PRESETS: dict[str, ModelConfig] = {
    "llama-3.1-8b": _preset(
        "llama",
        (4096, 32, 32, 8, 128, 14336, 128256, 131072),
        rope_scaling=RopeScaling("llama3", 8.0, 1.0, 4.0, 8192),
        eos_token_ids=(128001, 128008, 128009),
        bos_token_id=128000,
    ),
    "qwen3-0.6b": _preset("qwen3", (1024, 28, 16, 8, 128, 3072, 151936, 40960)),
    "smollm2-135m": _preset(
        "llama",
        (576, 30, 9, 3, 64, 1536, 49152, 8192),
        rope_theta=100000.0,
        tie_word_embeddings=True,
        eos_token_ids=(2,),
        bos_token_id=1,
    ),
    "qwen2-0.5b": _preset("qwen2", (896, 24, 14, 2, 64, 4864, 151936, 32768)),
    # the toy Llama scales rotary frequencies from 64 positions, so short tests exercise it
    "tiny-llama": _preset(
        "llama",
        (64, 2, 4, 2, 16, 128, 512, 2048),
        rope_scaling=RopeScaling("llama3", 8.0, 1.0, 4.0, 64),
        **_TOY,
    ),
    "tiny-qwen3": _preset("qwen3", (64, 2, 4, 2, 32, 128, 512, 2048), **_TOY),
}


def get_preset(name: str) -> ModelConfig:
    """A preset architecture by name (``llama-3.1-8b``, ``qwen3-0.6b``, ``tiny-llama``, ...)."""
    try:
        return PRESETS[name.lower()]
    except KeyError:
        raise ValueError(f"unknown model preset {name!r}; known: {sorted(PRESETS)}") from None
