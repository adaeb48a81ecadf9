"""Cost models: the time of a GPU step for a batch plan, and of the CPU stages around it."""

from __future__ import annotations

from sim.costs.base import CpuCosts, GpuCostModel
from sim.costs.presets import HARDWARE, Hardware, hardware, model_shape
from sim.costs.profile import Profile, ProfileError, read_profile
from sim.costs.registry import (
    COST_MODELS,
    DEFAULT_CPU_PROFILE,
    CostSpec,
    load_cpu_costs,
    make_cost_model,
)
from sim.costs.roofline import RooflineCostModel
from sim.costs.table import TableCostModel

__all__ = [
    "COST_MODELS",
    "DEFAULT_CPU_PROFILE",
    "HARDWARE",
    "CostSpec",
    "CpuCosts",
    "GpuCostModel",
    "Hardware",
    "Profile",
    "ProfileError",
    "RooflineCostModel",
    "TableCostModel",
    "hardware",
    "load_cpu_costs",
    "make_cost_model",
    "model_shape",
    "read_profile",
]
