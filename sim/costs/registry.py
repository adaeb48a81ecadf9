"""Cost models by name, and the CPU stage costs that go with them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from sim.costs.base import CpuCosts, GpuCostModel
from sim.costs.presets import hardware, model_shape
from sim.costs.profile import Profile, ProfileError, cpu_costs_from, read_profile
from sim.costs.roofline import RooflineCostModel
from sim.costs.table import TableCostModel

DEFAULT_CPU_PROFILE = Path(__file__).resolve().parents[2] / "profiles" / "cpu_costs.csv"


@dataclass(frozen=True, slots=True)
class CostSpec:
    """What a cost model is built from (``SimConfig.cost_spec`` makes one)."""

    model: str
    hardware: str
    tp: int
    dtype: str
    kv_dtype: str
    profile: Profile | None = None


def _roofline(spec: CostSpec) -> GpuCostModel:
    return RooflineCostModel(
        model_shape(spec.model),
        hardware(spec.hardware),
        spec.tp,
        spec.dtype,
        spec.kv_dtype,
        name=spec.model,
    )


def _table(spec: CostSpec) -> GpuCostModel:
    if spec.profile is None:
        raise ProfileError("the 'table' cost model needs a profile (--profile FILE)")
    return TableCostModel(spec.profile, spec.tp)


COST_MODELS: dict[str, Callable[[CostSpec], GpuCostModel]] = {
    "roofline": _roofline,
    "table": _table,
}


def make_cost_model(name: str, spec: CostSpec) -> GpuCostModel:
    try:
        factory = COST_MODELS[name]
    except KeyError:
        raise ValueError(f"unknown cost model {name!r}; known: {sorted(COST_MODELS)}") from None
    return factory(spec)


def load_cpu_costs(profile: Profile | None, default: Path | str = DEFAULT_CPU_PROFILE) -> CpuCosts:
    """CPU costs from ``profile`` where it has them, else from the committed default file."""
    if profile is not None and set(profile.cpu) >= set(CpuCosts.KINDS):
        return cpu_costs_from(profile)
    base = cpu_costs_from(read_profile(default))
    if profile is None or not profile.cpu:
        return base
    return cpu_costs_from(profile, fallback=base)
