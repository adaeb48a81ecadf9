"""The model side of a scheduler process: run a plan, return sampled tokens.

``RunnerArgs`` imports no torch (the frontend reads it inside the serve config); the
runner itself is imported on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from engine.runner.args import RunnerArgs
from engine.runner.inputs import StepInputs

if TYPE_CHECKING:
    from engine.runner.model_runner import ModelRunner

__all__ = ["ModelRunner", "RunnerArgs", "StepInputs"]


def __getattr__(name: str) -> Any:
    if name == "ModelRunner":
        from engine.runner.model_runner import ModelRunner

        return ModelRunner
    raise AttributeError(f"module 'engine.runner' has no attribute {name!r}")
