#!/usr/bin/env bash
# The GPU test suite and benchmarks in one command, on the lent GPU machine.
#
#   here:   .venv/bin/python scripts/gpu_prepare.py          (fills .gpu/, needs PyPI)
#   there:  bash scripts/gpu_suite.sh OUT_DIR [PART ...]     (carry .gpu; OUT_DIR e.g. $OUT)
#
# Parts (default: all, in this order; each bounded by its own timeout):
#   probe     where decode-graph capture spends its time (with and without PDL)
#   tests     tests/test_gpu_engine.py (the TP=2 test needs two GPUs)
#   runner    decode step time and prefill MFU, Llama-3.1-8B shape
#   runner_tp2  decode step time at TP=2 over NCCL (two GPUs)
#   overlap   idle GPU time between decode steps, overlap on and off
#   serve     the offline workload over HTTP: Llama-3.1-8B (overlap on and off), Qwen3-0.6B
#   profile   `engine profile` of the Llama-3.1-8B shape -> OUT_DIR/h200_llama-3.1-8b.csv
# Each part writes its JSON/log files into OUT_DIR; the last lines of each log are printed.
# On the lent machine only 8 files come back: run it on a scratch folder and tar that into $OUT.
set -u
out=${1:?usage: gpu_suite.sh OUT_DIR [PART ...]}
shift
parts=${*:-probe tests runner runner_tp2 overlap serve profile}
mkdir -p "$out"
source scripts/gpu_env.sh || exit 1
gpus=$(python3 -c "import torch; print(torch.cuda.device_count())")
run() {  # run NAME SECONDS CMD...: the command's output to OUT_DIR/NAME.log, its tail here
    local name=$1 seconds=$2
    shift 2
    echo "== $name ($(date +%T))"
    timeout "$seconds" "$@" >"$out/$name.log" 2>&1
    echo "exit $?"
    tail -n 12 "$out/$name.log"
}
for part in $parts; do
    case $part in
    probe)
        run probe 120 python3 scripts/gpu_capture_probe.py --max-bs 16
        run probe_no_pdl 120 python3 scripts/gpu_capture_probe.py --max-bs 16 --no-pdl
        ;;
    tests) run tests 420 python3 -m pytest -q -x -p no:cacheprovider tests/test_gpu_engine.py ;;
    runner)
        run runner 300 python3 scripts/bench_gpu_runner.py --out "$out/runner_llama8b.json" \
            --profile-dir "$out"
        ;;
    runner_tp2)
        if [ "$gpus" -ge 2 ]; then
            run runner_tp2 300 python3 scripts/bench_gpu_runner.py --tp 2 --skip-prefill \
                --batches 1,16,64,256 --contexts 1024 --out "$out/runner_llama8b_tp2.json"
        else
            echo "runner_tp2: needs two GPUs, $gpus here"
        fi
        ;;
    overlap) run overlap 300 python3 scripts/bench_gpu_overlap.py --out "$out/overlap.json" ;;
    serve)
        run serve_llama 300 python3 scripts/bench_gpu_serve.py --model llama-3.1-8b \
            --out "$out/serve_llama8b.json"
        run serve_llama_no_overlap 240 python3 scripts/bench_gpu_serve.py --model llama-3.1-8b \
            --hf-batch 0 --port 18300 --out "$out/serve_llama8b_no_overlap.json" \
            --serve-args --no-overlap
        run serve_qwen3 240 python3 scripts/bench_gpu_serve.py --model qwen3-0.6b --port 18200 \
            --out "$out/serve_qwen3.json"
        ;;
    profile)
        run profile 400 python3 -m engine.cli profile --model llama-3.1-8b --dummy-weights \
            --tokenizer .gpu/tokenizer --device cuda --max-seconds 240 \
            --out "$out/h200_llama-3.1-8b.csv"
        ;;
    *) echo "unknown part $part" ;;
    esac
done
