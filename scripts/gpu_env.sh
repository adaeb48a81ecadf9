# Source at the start of every command on the GPU machine (repository root, `.gpu/`
# carried; see scripts/gpu_prepare.py):  source scripts/gpu_env.sh && python3 ...
# Installs the carried wheels and FlashInfer into /tmp/site, puts compiled FlashInfer
# kernels where it loads them without compiling, sets the environment, and checks
# that every import the engine needs works before anything starts a server.
export SITE=/tmp/site
if [ ! -d "$SITE/flashinfer" ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target "$SITE" .gpu/wheels/*.whl || return 1
    tar xzf .gpu/flashinfer.tar.gz -C "$SITE" || return 1
    aot=$(mktemp -d) && tar xzf gpu/flashinfer-jit-sm90.tar.gz -C "$aot" || return 1
    for so in "$aot"/*.so; do  # the compiled kernels, where FlashInfer loads them
        [ -e "$so" ] || continue
        name=$(basename "$so" .so)
        mkdir -p "$SITE/flashinfer/data/aot/$name" && cp "$so" "$SITE/flashinfer/data/aot/$name/"
    done
    rm -rf "$aot"
fi
export PYTHONPATH="$PWD:$SITE"
export PYTHONUNBUFFERED=1
export TORCH_CUDA_ARCH_LIST=9.0
export FLASHINFER_WORKSPACE_BASE=/tmp/flashinfer-ws
export MAX_JOBS=16
# NVLink multicast stays off on the shared multi-GPU hosts
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
python3 -c "import flashinfer, zmq, msgspec, fastapi, uvicorn, simpy, plotly, pyinstrument, lab.cli.engine, lab.cli.sim" \
    || return 1
echo "gpu env ready: $(ls "$SITE/flashinfer/data/aot" 2>/dev/null | wc -l) precompiled FlashInfer modules"
