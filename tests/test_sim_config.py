"""Replay configuration: defaults, JSON/TOML files, overrides and KV sizing."""

from __future__ import annotations

from pathlib import Path

import pytest

from sim.config import SimConfig, build_config
from sim.costs import hardware, model_shape


def test_default_kv_pages_come_from_memory_left_after_weights() -> None:
    cfg = build_config()
    llama, h200 = model_shape("llama-3.1-8b"), hardware("h200")
    kv_bytes = h200.hbm_bytes * 0.85 - llama.num_params * 2  # mem_fraction, as the engine
    assert cfg.resolved_num_pages() == int(kv_bytes // (16 * llama.kv_bytes_per_token(2)))
    tp2 = build_config(tp=2)
    assert tp2.resolved_num_pages() > 2 * cfg.resolved_num_pages()  # weights split, KV heads split
    assert build_config(kv_memory_gb=1.0).resolved_num_pages() == int(1e9 // (16 * 131072))
    assert build_config(num_pages=123).scheduler_config().num_pages == 123


def test_config_files_and_overrides(tmp_path: Path) -> None:
    toml = tmp_path / "c.toml"
    toml.write_text('model = "qwen3-0.6b"\n[scheduler]\npolicy = "lpm"\nmax_running = 32\n')
    cfg = build_config(toml, max_running=8)
    assert (cfg.model, cfg.policy, cfg.max_running) == ("qwen3-0.6b", "lpm", 8)
    js = tmp_path / "c.json"
    js.write_text('{"overlap": true, "costs": {"profile": "p.csv"}}')
    cfg = build_config(js)
    assert cfg.overlap and cfg.cost_model == "table"  # a profile implies the table model
    assert build_config(js, cost_model="roofline").cost_model == "roofline"
    reserve = build_config(reserve_decode=True, new_token_ratio_decay_steps=50).scheduler_config()
    assert reserve.reserve_decode and reserve.new_token_ratio_decay_steps == 50


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"polcy": "fcfs"}', "unknown config keys \\['polcy'\\]"),
        ('{"policy": "random"}', "unknown policy 'random'"),
        ('{"max_running": 0}', "max_running must be a positive integer"),
        ('{"model": "gpt-9"}', "unknown model preset"),
        ("{oops", "cannot parse config"),
        ('{"min_new_token_ratio": 0.9}', "min_new_token_ratio <= init_new_token_ratio"),
    ],
)
def test_bad_config_is_a_clear_error(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(ValueError, match=message):
        build_config(path)


def test_config_is_recorded_whole() -> None:
    d = SimConfig().to_dict()
    assert d["resolved_num_pages"] == SimConfig().resolved_num_pages()
    assert {"model", "hardware", "tp", "policy", "overlap", "num_tokenizers"} <= set(d)
