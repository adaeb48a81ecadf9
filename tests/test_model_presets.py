"""One table of model shapes for both worlds: the engine's presets are the simulator's shapes."""

from __future__ import annotations

from dataclasses import replace

from schema.models import PRESETS, ModelConfig
from sim.costs.presets import MODELS


def test_the_simulator_prices_the_engines_presets() -> None:
    assert set(MODELS) == set(PRESETS)
    for name, shape in MODELS.items():
        c = PRESETS[name]
        assert (shape.hidden, shape.layers, shape.heads, shape.kv_heads) == (
            c.hidden_size,
            c.num_layers,
            c.num_heads,
            c.num_kv_heads,
        )
        assert (shape.head_dim, shape.intermediate, shape.vocab) == (
            c.head_dim,
            c.intermediate_size,
            c.vocab_size,
        )
        assert shape.tied_embeddings == c.tie_word_embeddings


def test_the_smollm2_preset_is_the_served_models_config(model_ready: str) -> None:
    """The preset copies the published config.json that ``engine setup`` converts."""
    served = ModelConfig.from_dir(model_ready)
    preset = PRESETS["smollm2-135m"]
    # the folder stores float32 weights and its eps rounded through float32
    assert abs(served.rms_norm_eps - preset.rms_norm_eps) < 1e-9
    assert replace(served, dtype=preset.dtype, rms_norm_eps=preset.rms_norm_eps) == preset
