"""The step record's columns follow the scheduler core's step shape."""

from __future__ import annotations

from dataclasses import fields

from core.scheduler import StepShape
from schema.steprecord import SHAPE_COLUMNS, STEP_RECORD_COLUMNS


def test_shape_columns_are_the_step_shape_fields() -> None:
    assert tuple(f.name for f in fields(StepShape)) == SHAPE_COLUMNS
    assert STEP_RECORD_COLUMNS[-len(SHAPE_COLUMNS) :] == SHAPE_COLUMNS
