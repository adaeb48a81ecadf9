"""The model side of a scheduler process: run a plan, return sampled tokens."""

from engine.runner.args import RunnerArgs
from engine.runner.inputs import StepInputs
from engine.runner.model_runner import ModelRunner

__all__ = ["ModelRunner", "RunnerArgs", "StepInputs"]
