"""Prepare everything a run on the GPU machine needs, in the ignored folder ``.gpu/``.

The GPU machine has torch, transformers and triton but no registry access and no
model hub, and at most 64 MiB travel with each call. Run this here (it needs
PyPI), then send ``.gpu`` along and start each remote command with
``source scripts/gpu_env.sh``::

    .venv/bin/python scripts/gpu_prepare.py            # writes .gpu/
    # device call: carry [".gpu"], command "source scripts/gpu_env.sh && ..."

What ``.gpu/`` holds:

- ``wheels/``: cp312 wheels of the serving and simulator dependencies that the
  machine lacks (ZeroMQ, msgspec, FastAPI and its stack, uvicorn, SimPy, Plotly, pyinstrument);
- ``flashinfer.tar.gz``: ``flashinfer-python`` 0.2.14.post1 from its source
  archive, with the CUDA sources and headers (CUTLASS, spdlog) it compiles its
  kernels from on first use (JIT, about two minutes on that machine; the
  kernels the engine uses come compiled in the tracked
  ``gpu/flashinfer-jit-sm90.tar.gz``, which ``gpu_env.sh`` unpacks there);
- ``tokenizer/``: SmolLM2's tokenizer, chat template and configs without weights
  (dummy-weight presets borrow it with ``--tokenizer .gpu/tokenizer``);
- ``base/`` (with ``--base REV``): the code of commit ``REV`` (its tracked files but
  reports, traces, tests and docs), for ``scripts/gpu_ab.sh``: an A/B of the working tree
  against ``REV`` in one run. A run without ``--base`` removes it.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FLASHINFER = "flashinfer-python==0.2.14.post1"
WHEELS = [
    "simpy==4.1.2",
    "pyzmq==27.3.0",
    "msgspec==0.23.0",
    "fastapi==0.165.0",
    "starlette==1.10.0",
    "pydantic==2.14.4",
    "pydantic_core==2.50.5",
    "uvicorn==0.54.0",
    "annotated-types==0.8.0",
    "annotated-doc==0.0.7",
    "typing-inspection==0.4.5",
    "opentelemetry-api==1.45.2",
    "plotly==7.1.0",
    "narwhals==2.29.0",
    "aiohttp==3.14.5",  # engine router, with its dependencies below
    "aiohappyeyeballs==2.7.1",
    "aiosignal==1.4.0",
    "frozenlist==1.8.0",
    "multidict==7.2.1",
    "yarl==1.25.1",
    "propcache==0.5.4",
    "idna==3.20",
    "pyinstrument==5.1.3",  # engine serve --host-profile
]
PLATFORMS = [
    "manylinux_2_28_x86_64",
    "manylinux_2_27_x86_64",
    "manylinux_2_17_x86_64",
    "manylinux2014_x86_64",
    "manylinux1_x86_64",
]
DATA_DIRS = {  # flashinfer/data/<name> <- <archive>/<path>
    "csrc": "csrc",
    "include": "include",
    "tvm_binding": "tvm_binding",
    "spdlog": "3rdparty/spdlog",
    "cutlass/include": "3rdparty/cutlass/include",
    "cutlass/tools/util/include": "3rdparty/cutlass/tools/util/include",
}


def pip(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "pip", *args], check=True)


def download_wheels(dest: Path) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    platforms = [a for p in PLATFORMS for a in ("--platform", p)]
    pip(
        "download",
        "-q",
        "--no-deps",
        "--only-binary=:all:",
        "--python-version",
        "3.12",
        "--implementation",
        "cp",
        *platforms,
        "-d",
        str(dest),
        *WHEELS,
    )


def build_flashinfer(dest: Path) -> None:
    """The ``flashinfer`` package with its ``data/`` folders filled, as a tarball."""
    with tempfile.TemporaryDirectory() as tmp:
        pip("download", "-q", "--no-deps", "--no-build-isolation", FLASHINFER, "-d", tmp)
        archive = next(Path(tmp).glob("flashinfer_python-*.tar.gz"))
        with tarfile.open(archive) as tar:
            tar.extractall(tmp, filter="data")
        src = next(p for p in Path(tmp).iterdir() if p.is_dir())
        package = src / "flashinfer"
        for name, path in DATA_DIRS.items():
            target = package / "data" / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copytree(src / path, target, dirs_exist_ok=True)
        with tarfile.open(dest, "w:gz") as out:
            out.add(package, arcname="flashinfer")


def copy_tokenizer(model: Path, dest: Path) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    for f in model.iterdir():
        if f.suffix in (".json", ".jinja", ".txt"):
            shutil.copy(f, dest / f.name)


BASE_LEAVES = ("reports", "traces", "tests", "docs")
"""Tracked folders that ``base/`` leaves out: nothing an A/B runs needs them."""


def export_base(rev: str, dest: Path) -> None:
    """``rev``'s tracked files (but ``BASE_LEAVES``) in ``dest``, its full hash in ``.ab_rev``."""
    full = subprocess.run(
        ["git", "rev-parse", "--verify", f"{rev}^{{commit}}"],
        cwd=ROOT, capture_output=True, text=True, check=False,
    )  # fmt: skip
    if full.returncode != 0:
        sys.exit(f"--base {rev}: not a commit of this repository")
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    archive = subprocess.run(
        ["git", "archive", "--format=tar", full.stdout.strip()],
        cwd=ROOT, capture_output=True, check=True,
    )  # fmt: skip
    with tempfile.TemporaryFile() as f:
        f.write(archive.stdout)
        f.seek(0)
        with tarfile.open(fileobj=f) as tar:
            keep = [m for m in tar.getmembers() if m.name.split("/")[0] not in BASE_LEAVES]
            tar.extractall(dest, members=keep, filter="data")
    (dest / ".ab_rev").write_text(full.stdout)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--out", type=Path, default=ROOT / ".gpu")
    ap.add_argument("--base", metavar="REV", help="a commit to A/B against (scripts/gpu_ab.sh)")
    args = ap.parse_args()
    from engine.models.setup import ensure_model

    out: Path = args.out
    out.mkdir(exist_ok=True)
    download_wheels(out / "wheels")
    if not (out / "flashinfer.tar.gz").exists():
        build_flashinfer(out / "flashinfer.tar.gz")
    copy_tokenizer(ensure_model("smollm2-135m"), out / "tokenizer")
    if args.base:
        export_base(args.base, out / "base")
        print(f"{out / 'base'}: {args.base}")
    elif (out / "base").exists():
        shutil.rmtree(out / "base")
        print(f"removed {out / 'base'} (no --base)")
    size = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
    print(f"{out}: {size / 2**20:.1f} MiB")
    if size > 48 * 2**20:
        print("warning: a device call carries at most 64 MiB with the repository", file=sys.stderr)


if __name__ == "__main__":
    main()
