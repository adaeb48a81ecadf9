"""One model-shape class for both worlds: the simulator sizes and prices the engine's presets."""

from __future__ import annotations

from dataclasses import replace

import pytest

from schema.models import PRESETS, ModelConfig
from sim.config import build_config
from sim.costs.presets import DTYPE_BYTES, model_shape


def test_the_simulator_prices_the_engines_presets() -> None:
    for name, config in PRESETS.items():
        assert model_shape(name) is config
    with pytest.raises(ValueError, match="unknown model preset 'gpt-5'"):
        model_shape("gpt-5")


@pytest.mark.parametrize("tp", [1, 2, 4, 8])
def test_the_simulators_kv_bytes_are_the_engines_per_rank(tp: int) -> None:
    """A simulated GPU's KV bytes per token are those of the engine's fullest rank."""
    llama = PRESETS["llama-3.1-8b"]
    config = build_config(tp=tp, kv_dtype="fp8", cost_model="roofline")
    assert config.kv_bytes_per_token_per_gpu() == llama.kv_bytes_per_token(1, tp)
    # 8 KV heads split over tp ranks, 32 layers of 128-dim K and V, two bytes each
    assert llama.kv_bytes_per_token(DTYPE_BYTES["bf16"], tp) == 2 * 32 * (8 // tp) * 128 * 2


def test_smollm2s_uneven_kv_heads_size_by_the_fullest_rank() -> None:
    """SmolLM2's 3 KV heads on 2 ranks split 2 + 1: a GPU holds 2 heads' worth per token."""
    smol = PRESETS["smollm2-135m"]
    assert smol.kv_bytes_per_token(2, tp_size=2) == 2 * 30 * 2 * 64 * 2


def test_weights_read_per_step_counts_the_lm_head_once_tied_or_not() -> None:
    smol, llama = PRESETS["smollm2-135m"], PRESETS["llama-3.1-8b"]
    for c in (smol, llama):
        assert c.weights_read_per_step == c.num_layers * c.layer_params + c.embedding_params
    assert smol.tie_word_embeddings and not llama.tie_word_embeddings
    # the full count adds the untied input embedding and the norms
    assert llama.num_params > llama.weights_read_per_step + llama.embedding_params


def test_the_smollm2_preset_is_the_served_models_config(model_ready: str) -> None:
    """The preset copies the published config.json that ``engine setup`` converts."""
    served = ModelConfig.from_dir(model_ready)
    preset = PRESETS["smollm2-135m"]
    # the folder stores float32 weights and its eps rounded through float32
    assert abs(served.rms_norm_eps - preset.rms_norm_eps) < 1e-9
    assert replace(served, dtype=preset.dtype, rms_norm_eps=preset.rms_norm_eps) == preset
