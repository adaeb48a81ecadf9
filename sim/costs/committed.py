"""The committed profile of a model on a hardware: the simulator's default step-time model.

``profiles/`` holds the profiles ``engine profile`` measured, each named
``HARDWARE_MODEL[_tpN].csv`` after the simulator's hardware and model presets.
A replay that asks for neither a profile nor a cost model prices its steps with
the ``table`` model fitted to the committed profile of its model, hardware and
TP degree when one exists and was measured in the replay's dtype (with the KV
cache in the same dtype), and with the ``roofline`` otherwise.
"""

from __future__ import annotations

from pathlib import Path

from sim.costs.profile import ProfileError, display_path, read_profile

PROFILES_DIR = Path(__file__).resolve().parents[2] / "profiles"
DTYPES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}
"""The simulator's name of a profile's ``dtype`` header."""


def profile_dtype(profile: Path | str) -> str | None:
    """The simulator's name of the dtype ``profile`` was measured in (None: not stated)."""
    return DTYPES.get(read_profile(profile).provenance.get("dtype", ""))


def committed_profile(
    model: str, hardware: str, tp: int, dtype: str, kv_dtype: str, folder: Path = PROFILES_DIR
) -> Path | None:
    """The profile in ``folder`` named for ``model`` on ``hardware`` at ``tp``, if it was
    measured in ``dtype`` and ``kv_dtype`` is the same; a file whose header names another
    model or TP degree than its name is an error."""
    path = folder / (f"{hardware}_{model}" + (f"_tp{tp}" if tp > 1 else "") + ".csv")
    if not path.is_file() or kv_dtype != dtype:
        return None
    profile = read_profile(path)
    header_model = (profile.provenance["model"].split() or [""])[0]
    header_tp = profile.provenance.get("tp", "1")
    if header_model != model or header_tp != str(tp):
        raise ProfileError(
            f"{display_path(path)} is named for {model} at tp {tp}, but its header says "
            f"model {header_model!r}, tp {header_tp}"
        )
    if DTYPES.get(profile.provenance.get("dtype", "")) != dtype:
        return None
    return path
