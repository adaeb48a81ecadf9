"""The table cost model: a linear fit to measured step times of a profile.

    step = c0 + c_prefill * prefill_tokens + c_decode * decode_requests
           + c_context * context_tokens

fitted by least squares to the profile's GPU rows of the configured TP degree.
A fit is only as good as the rows' coverage; ``fit_error`` (the largest relative
error over the rows) is part of the provenance so a report can say so.
"""

from __future__ import annotations

import numpy as np

from sim.costs.base import GpuCostModel, StepShape
from sim.costs.profile import Profile, ProfileError

FEATURES = ("intercept", "prefill_tokens", "decode_requests", "context_tokens")


class TableCostModel(GpuCostModel):
    name = "table"

    def __init__(self, profile: Profile, tp: int = 1) -> None:
        rows = profile.gpu[profile.gpu[:, 3] == tp] if len(profile.gpu) else profile.gpu
        if len(rows) == 0:
            have = sorted({int(t) for t in profile.gpu[:, 3]}) if len(profile.gpu) else []
            raise ProfileError(f"{profile.path}: no GPU step rows for tp={tp} (have tp {have})")
        x = np.column_stack([np.ones(len(rows)), rows[:, 0], rows[:, 1], rows[:, 2]])
        y = rows[:, 4]
        used = x.any(axis=0)
        coef = np.zeros(len(FEATURES))
        coef[used], *_ = np.linalg.lstsq(x[:, used], y, rcond=None)
        self.coef = coef
        self.tp = tp
        self.profile = profile.path
        pred = np.maximum(x @ coef, 0.0)
        self.fit_error = float(np.max(np.abs(pred - y) / np.maximum(y, 1e-12)))
        terms = ", ".join(f"{n}={c:.4g}" for n, c in zip(FEATURES, coef, strict=True))
        self.provenance = (
            f"linear fit to {len(rows)} rows (tp={tp}) of {profile.path} [{terms}; "
            f"max relative error {self.fit_error:.1%}]: {profile.provenance_text()}"
        )

    def step_time(self, shape: StepShape) -> float:
        if shape.prefill_tokens + shape.decode_requests == 0:
            return 0.0
        c = self.coef
        t = (
            c[0]
            + c[1] * shape.prefill_tokens
            + c[2] * shape.decode_requests
            + c[3] * shape.context_tokens
        )
        return max(float(t), 0.0)

    def decode_times(self, batch: int, context_tokens: int, k: int) -> np.ndarray:
        c = self.coef
        ctx = context_tokens + batch * np.arange(k, dtype=np.float64)
        times: np.ndarray = np.maximum(c[0] + c[2] * batch + c[3] * ctx, 0.0)
        return times
