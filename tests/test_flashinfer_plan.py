"""The plan-time ``max`` bound into FlashInfer's modules gives the builtin's answers."""

from __future__ import annotations

import types

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.attention import flashinfer_plan
from engine.attention.flashinfer_plan import install, tensor_max


@settings(max_examples=50, deadline=None)
@given(st.lists(st.integers(0, 2**31 - 1), min_size=1, max_size=300))
def test_tensor_max_equals_the_builtin_on_tensors(values: list[int]) -> None:
    t = torch.tensor(values, dtype=torch.int32)
    assert tensor_max(t).item() == max(t).item() == max(values)


def test_other_calls_go_to_the_builtin() -> None:
    assert tensor_max([3, 9, 2]) == 9
    assert tensor_max(5, 128) == 128
    assert tensor_max([], default=-1) == -1
    with pytest.raises(ValueError, match="empty"):
        tensor_max(torch.tensor([], dtype=torch.int32))


def test_install_binds_max_unless_turned_off(monkeypatch: pytest.MonkeyPatch) -> None:
    module = types.ModuleType("wrappers")
    exec("def longest(x):\n    return max(x).item()\n", module.__dict__)
    lens = torch.tensor([7, 4096, 12], dtype=torch.int32)
    assert install([module])
    assert module.max is flashinfer_plan.tensor_max
    assert module.longest(lens) == 4096
    monkeypatch.setenv("SERVELAB_FLASHINFER_FAST_MAX", "0")
    assert not install([module])
    assert not hasattr(module, "max")
    assert module.longest(lens) == 4096
