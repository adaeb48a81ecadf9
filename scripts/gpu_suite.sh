#!/usr/bin/env bash
# The GPU test suite and benchmarks in one command, on the lent GPU machine.
#
#   here:   .venv/bin/python scripts/gpu_prepare.py          (fills .gpu/, needs PyPI)
#   there:  bash scripts/gpu_suite.sh OUT_DIR [PART ...]     (carry .gpu; OUT_DIR e.g. $OUT)
#
# Parts (default: all, in this order; each bounded by its own timeout):
#   probe     where decode-graph capture spends its time (with and without PDL)
#   tests     tests/test_gpu_engine.py (the TP=2 test needs two GPUs), tests/test_fused_rope.py,
#             tests/test_decode_pieces.py, tests/test_staging.py
#   runner    decode step time and prefill MFU, Llama-3.1-8B shape
#   runner_tp2  decode step time at TP=2 over NCCL (two GPUs)
#   ab        decode steps (device time from CUDA events, host launch time) and profiles,
#             FlashInfer's kernels against the fused QK-norm + rotary + KV-write kernel,
#             Llama-3.1-8B and Qwen3-0.6B shapes, 1k contexts
#   interactive  one stream at a time over HTTP (1k and 8k prompts): TTFT and TPOT against
#             one prefill and one batch-1 decode step, and the runner's batch-1 step, both
#             kernel variants, Llama-3.1-8B and Qwen3-0.6B shapes
#   hostpath  one Qwen3-0.6B stream (1k prompt, 256 tokens), plain and then with
#             `engine serve --host-profile` (every process's call tree, OUT_DIR/host_profile/)
#             and the step record (OUT_DIR/hostpath_steps.csv): where the host's time per token goes
#   spec_profile  decode and verify steps (4 drafts) of the Llama-3.1-8B shape at batches 1-128
#             -> OUT_DIR/spec_profile.csv
#   spec_cross  speculative decoding's speed-up per concurrency (1,4,16,64: $SPEC_CONCURRENCY) with
#             synthetic acceptance at the CPU's copy-heavy per-position rates ($SPEC_RATES), real
#             against simulated with $SPEC_PROFILE (default OUT_DIR/spec_profile.csv)
#   coldlaunch  how long eager steps (prefills, mixed, a chunk beside verify spans) hold the host
#             when each plan is timed once between others (cold.csv) against repeated back to
#             back (warm.csv), Llama-3.1-8B shape: `sim profile compare --measure launch`
#   launchctx an eager step's host launch (a prefill, a chunk beside decodes) in the contexts
#             serving launches it in: as the profile times it, after idling, after graph-replayed
#             decodes, behind a decode in flight, beside busy cores (benchmarks/gpu/
#             launch_context.py); then one 8B stream's step record: its served launches
#   overlap   idle GPU time between decode steps, overlap on and off
#   attribution  `sim validate` with the engine's step record (error attribution) on the
#             Azure conversation trace, a busy window of the code trace and three long-prompt
#             traces with shared prefixes ($ATTR_RUNS, $ATTR_REPEATS)
#   cluster   `engine serve --dp 2 --dp-share-gpu` of Qwen3-0.6B against its simulation on the
#             Mooncake conversation trace or $CLUSTER_TRACE, per router policy ($CLUSTER_POLICIES,
#             _SCALE, _LIMIT, _REPEATS, _PROFILE, _MPS, _COLOCATION: a co-location table); the
#             Qwen3 profile measures the long grid; each replica records its steps (the
#             attribution sets the profile against each one's)
#   pd        prefill/decode disaggregation on one GPU: a Qwen3-0.6B prefill server and decode
#             server sharing it, against two colocated servers sharing it, each pair behind
#             `engine router`, real against simulated (benchmarks/pd_load.py) on $PD_TRACE
#             (the Azure conversation trace) at $PD_RATES, $PD_LIMIT requests, $PD_REPEATS runs,
#             SLOs $PD_SLO_TTFT_MS / $PD_SLO_TPOT_MS; each server takes $PD_MEM_FRACTION of the
#             GPU; PD_MPS=1 through the MPS daemon; the simulation prices steps by $PD_PROFILE
#             (default: the cluster part's Qwen3 profile, measured here) and stretches them by
#             the co-location table $PD_COLOCATION when given; each server's step record in
#             OUT_DIR/pd_steps/ (`sim colocation fit` makes such a table of them)
#   capacity  `sim validate --capacity` on a trace none of the model's choices saw (a `sim gen`
#             trace of mid-length prompts with shared prefixes, bursty; or $CAP_TRACE at
#             $CAP_SCALE, $CAP_LIMIT requests), SLOs TTFT <= $CAP_TTFT_MS (1000) and TPOT <=
#             $CAP_TPOT_MS (50) for 99 % of requests, $CAP_REPEATS (2) runs at the edge; the
#             simulated side with $CAP_PROFILE (the committed profile); $CAP_SERVE_ARGS more
#             server flags
#   alone     a run at the edge of the capacity trace ($ALONE_TRACE at $ALONE_SCALE, default the
#             mid-length trace at 1.3x) with its step record, then $ALONE_PLANS steps of each kind
#             timed alone (engine profile --plans-from): serving against the same plans alone,
#             device time and the host's launch; $ALONE_LIMIT requests, $ALONE_SERVE_ARGS more
#             server flags (e.g. --cpu-threads 1: does serving's host launch eager steps late
#             for want of cores?)
#   tier      the host KV tier: `sim validate` of a trace whose shared prefixes outgrow a small
#             device pool, with the tier off and on ($TIER_GB, $TIER_PAGES, $TIER_RATE; or
#             $TIER_TRACE with $TIER_LIMIT requests at $TIER_SCALE, e.g. a conversation sample of
#             the Mooncake trace, `sim trace conversations`; $TIER_SERVE_ARGS: more server
#             flags); the server records its steps
#   scatter   steps with every decode row under 8,192 tokens, each plan's pages contiguous
#             and then scattered over the pool as serving leaves them (engine profile
#             --scatter-pages; on 28 such plans the two agreed within 1.6 %,
#             reports/validate_h200/)
#   tokcopy   the tokenizer's speed alone, beside 48 GB of pinned memory, and beside 1 GB
#             host-to-device copies in a loop (benchmarks/gpu/tokenize_beside_copies.py)
#   split     single steps with long decodes, a step's decode rows planned apart from its
#             prefill chunk (and long ones cut into pieces) against all on the prefill wrapper
#             ($SPLIT_VARIANTS, default "0 1 0 1"; SPLIT_EAGER=1: once more without CUDA graphs)
#   fastmax   decode steps and idle GPU time with FlashInfer's plan() taking the longest
#             sequence on the tensor (the default) and element by element
#   serve     the offline workload over HTTP: Llama-3.1-8B (overlap on and off), Qwen3-0.6B
#   profile   `engine profile` of the Llama-3.1-8B shape over $LONG_GRID (the committed
#             profile's grid, and mixed steps inside it) -> OUT_DIR/h200_llama-3.1-8b.csv
#   ragged    decode steps of 2-32 rows up to 32k tokens, uniform and ragged (one long row among
#             1k ones), with held-out points of rows at random contexts in between: the cliff
#             between 16 rows (graph) and 17 (pieces, eager) -> OUT_DIR/ragged32k.csv (not merged
#             into the committed profile: reports/validate_h200/)
#   layouts   the load sweep over process layouts (benchmarks/layout_load.py): split, frontend
#             and inline against their simulations on the first $LAYOUT_LIMIT (250) requests
#             of the Azure conversation trace at rate scales $LAYOUT_RATES (2,5,10), or on
#             $LAYOUT_TRACE; $LAYOUT_REPEATS (1) real runs each
#   tokscale  1, 2 and 4 tokenizer workers ($TOKSCALE_WORKERS) on a trace whose long text
#             prompts share a 16k-token prefix (the tokenizer binds, the GPU little), real
#             against simulated (benchmarks/layout_load.py); $TOKSCALE_ROUNDS (1) sweeps in
#             turn, to OUT_DIR/tokscale_rR (a served tokenizer's speed drifts between runs
#             minutes apart on these hosts: reports/layouts/)
#   layout_ab a decoding request while a 32k-token text prompt arrives, per layout, at
#             prefill budgets $AB_BUDGETS (512,2048), $AB_REPEATS (2) runs each
#             (benchmarks/layout_ab.py; the step records too)
#   validate  the profile (the committed grid), then `sim validate` of the Azure conversation
#             trace against a live server at rate scales $RATES (default "3 5 7", $LIMIT
#             requests each, default 300);
#             PROFILE=FILE validates against FILE instead of measuring a new profile
# Each part writes its JSON/log files into OUT_DIR; the last lines of each log are printed.
# On the lent machine only 8 files come back: run it on a scratch folder and tar that into $OUT.
set -u
out=${1:?usage: gpu_suite.sh OUT_DIR [PART ...]}
shift
parts=${*:-probe tests runner runner_tp2 overlap serve profile}
RATES=${RATES:-3 5 7}
# the committed H200 profile's grid beyond the CUDA default: long prefixes and decodes, mixed
# steps inside the grid (8-128 decode rows of 1k-16k each, after 0-32k of prefix: at the edge of
# capacity a request waits on such steps, and a profile without them priced them 13 % low), and
# ragged rows on both sides of 8,192 tokens, past which FlashInfer plans a row apart or cuts it
# (reports/validate_h200/); about 620 plans, 330 s to time them
LONG_GRID="--prefill-prefixes 0,4096,16384,32768 --decode-contexts 256,1024,4096,16384
    --mixed-prefixes 0,4096,32768 --mixed-batches 8,32,64,128 --mixed-contexts 1024,4096,16384
    --ragged-longest 4096,16384"
LIMIT=${LIMIT:-300}
GPU_SERVE="--device cuda --dummy-weights --tokenizer .gpu/tokenizer"
# benchmarks/layout_load.py's flags for the Llama-3.1-8B shape on this GPU
GPU_LOAD_ARGS=(--model llama-3.1-8b --tokenizer .gpu/tokenizer --threads 4
    --serve-args "$GPU_SERVE --max-running 256" --validate-args "--max-running 256"
    --profile profiles/h200_llama-3.1-8b.csv)
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
serve_bg() {  # serve_bg PORT LOG [ARGS...]: a Llama-3.1-8B server in the background; its pid
    local port=$1 log=$2
    shift 2
    python3 -m lab.cli.engine serve --model llama-3.1-8b --dummy-weights --tokenizer .gpu/tokenizer \
        --device cuda --port "$port" --max-running 256 "$@" >"$log" 2>&1 &
    echo $!
}
wait_ready() {  # wait_ready URL PID SECONDS: 0 once /health answers, 1 if the server died or timed out
    for _ in $(seq "$3"); do
        python3 -c "import httpx,sys; sys.exit(httpx.get('$1/health').status_code != 200)" \
            2>/dev/null && return 0
        kill -0 "$2" 2>/dev/null || { echo "server $2 died"; return 1; }
        sleep 1
    done
    echo "server $2 not ready after $3 s"
    return 1
}
host_cpu() {  # the CPU stage costs of this host, once per output folder: each validation's
    # simulation takes them (--cpu-profile) over its profile's, measured on another host
    # (two H200 hosts' tokenizers differed by 37 %: reports/cluster/)
    [ -f "$out/host_cpu.csv" ] || python3 -m lab.cli.engine profile --model llama-3.1-8b \
        --dummy-weights --tokenizer .gpu/tokenizer --device cuda --no-steps \
        --out "$out/host_cpu.csv" >"$out/host_cpu.log" 2>&1
    [ -f "$out/host_cpu.csv" ] && echo "--cpu-profile $out/host_cpu.csv"
}
qwen3_profile() {  # qwen3_profile FILE: the Qwen3-0.6B profile, long grid, unless FILE exists
    [ -f "$1" ] || run profile_qwen3 200 python3 -m lab.cli.engine profile --model qwen3-0.6b \
        --dummy-weights --tokenizer .gpu/tokenizer --device cuda $LONG_GRID \
        --max-seconds "${CLUSTER_PROFILE_SECONDS:-90}" --out "$1"
}
mid_prefix_trace() {  # the capacity part's held-out trace (mid-length prompts, shared prefixes)
    python3 -m lab.cli.sim gen --arrival gamma --cv 2.0 --rate 8 --input uniform:256:6144 \
        --output uniform:32:384 --num 300 --prefix-groups 10 --prefix-len uniform:512:3072 \
        --seed 41 --out build/mid_prefix.jsonl
}
for part in $parts; do
    case $part in  # measured before the part's server starts
    attribution|cluster|pd|capacity|alone|tier|validate|layouts|tokscale) cpu_flag=$(host_cpu) ;;
    esac
    case $part in
    probe)
        run probe 120 python3 benchmarks/gpu/capture_probe.py --max-bs 16
        run probe_no_pdl 120 python3 benchmarks/gpu/capture_probe.py --max-bs 16 --no-pdl
        ;;
    tests)
        run tests 420 python3 -m pytest -q -x -p no:cacheprovider tests/test_gpu_engine.py \
            tests/test_fused_rope.py tests/test_decode_pieces.py tests/test_staging.py
        ;;
    runner)
        run runner 300 python3 benchmarks/gpu/runner.py --out "$out/runner_llama8b.json" \
            --profile-dir "$out"
        ;;
    runner_tp2)
        if [ "$gpus" -ge 2 ]; then
            run runner_tp2 300 python3 benchmarks/gpu/runner.py --tp 2 --skip-prefill \
                --batches 1,16,64,256 --contexts 1024 --out "$out/runner_llama8b_tp2.json"
        else
            echo "runner_tp2: needs two GPUs, $gpus here"
        fi
        ;;
    ab)  # AB_VARIANTS=base,fused,base,fused: each variant twice in one run, for the spread
        run runner_ab 360 python3 benchmarks/gpu/runner.py --variants "${AB_VARIANTS:-base,fused}" \
            --contexts 1024 --out "$out/runner_ab_llama8b.json" --profile-dir "$out"
        run runner_ab_qwen3 200 python3 benchmarks/gpu/runner.py --model qwen3-0.6b \
            --variants "${AB_VARIANTS:-base,fused}" --contexts 1024 --skip-prefill \
            --out "$out/runner_ab_qwen3.json"
        ;;
    interactive)
        run interactive 330 python3 benchmarks/gpu/interactive.py --variants base,fused \
            --runner-steps --out "$out/interactive_llama8b.json"
        run interactive_qwen3 240 python3 benchmarks/gpu/interactive.py --model qwen3-0.6b \
            --port 18600 --variants base,fused --runner-steps --out "$out/interactive_qwen3.json"
        ;;
    hostpath)  # one Qwen3-0.6B stream: plain, then with every process's host profile
        for prof in 0 1; do
            extra=()
            [ "$prof" = 1 ] && extra=(--serve-args --host-profile "$out/host_profile"
                --record-steps "$out/hostpath_steps.csv")
            run "hostpath_$prof" 200 python3 benchmarks/gpu/interactive.py --model qwen3-0.6b \
                --port 18700 --prompts 1024 --repeats 5 --out "$out/hostpath_$prof.json" "${extra[@]}"
        done
        ;;
    spec_profile)  # decode and verify steps (4 drafts) of the Llama-3.1-8B shape, for spec_cross
        run spec_profile 300 python3 -m lab.cli.engine profile --model llama-3.1-8b --dummy-weights \
            --device cuda --tokenizer .gpu/tokenizer --decode-batches 1,4,16,32,64,128 \
            --decode-contexts 128,1024 --verify-drafts 4 --prefill-tokens 32,64,512 --prefill-prefixes 0 \
            --prefill-chunks 1,512 --mixed-batches 16 --mixed-prefixes 0 --mixed-contexts 1024 \
            --mixed-prefill 32,256 --ragged-longest 4096 --repeats 3 --out "$out/spec_profile.csv"
        ;;
    spec_cross)  # where speculation stops paying: synthetic acceptance at the CPU's copy-heavy rates
        run spec_cross 420 python3 benchmarks/speculative.py --model llama-3.1-8b \
            --tokenizer .gpu/tokenizer --serve-args "$GPU_SERVE --num-pages 8192" \
            --method synthetic --acceptance-rate "${SPEC_RATES:-0.6,0.85,0.89,0.83}" --ignore-eos \
            --workloads chat --requests 32 --max-tokens 64 --k 4 \
            --concurrency "${SPEC_CONCURRENCY:-1,4,16,64}" --profile "${SPEC_PROFILE:-$out/spec_profile.csv}" \
            --out-dir "$out/spec" --json "$out/spec_cross.json"
        ;;
    coldlaunch)  # serving launches an eager step between graph replays; the profile, back to back
        grid=(--model llama-3.1-8b --dummy-weights --device cuda --tokenizer .gpu/tokenizer
            --decode-batches 1,16 --decode-contexts 1024 --verify-drafts 4 --prefill-tokens 32,64,512
            --prefill-prefixes 0 --prefill-chunks 1 --mixed-batches 16 --mixed-prefixes 0
            --mixed-contexts 1024 --mixed-prefill 32,256 --holdout 24 --no-cpu-stages)
        run cold 200 python3 -m lab.cli.engine profile "${grid[@]}" --repeats 1 --warmup 0 \
            --out "$out/cold.csv"
        run warm 200 python3 -m lab.cli.engine profile "${grid[@]}" --repeats 3 --warmup 1 \
            --out "$out/warm.csv"
        python3 -m lab.cli.sim profile compare --base "$out/cold.csv" --new "$out/warm.csv" \
            --measure launch | tee "$out/coldlaunch.md"
        ;;
    launchctx)  # an eager step's launch in serving's contexts, then served steps' launches
        run launchctx 200 python3 benchmarks/gpu/launch_context.py --out "$out/launch_context.json"
        run launchctx_serve 150 python3 benchmarks/gpu/interactive.py --model llama-3.1-8b \
            --port 18700 --prompts 512 --new 32 --repeats 8 --out "$out/launchctx_serve.json" \
            --serve-args --record-steps "$out/launchctx_steps.csv"
        python3 benchmarks/gpu/launch_context.py --steps "$out/launchctx_steps.csv" \
            | tee "$out/launchctx_steps.txt"
        ;;
    overlap) run overlap 300 python3 benchmarks/gpu/overlap.py --out "$out/overlap.json" ;;
    attribution)  # sim validate with the engine's step record: three traces, three loads each
        # ATTR_RUNS: NAME:TRACE:LIMIT:SCALE ... (scales near 50/80/100 % of capacity, see
        # reports/validate_h200/README.md); the derived traces are made here.
        python3 -m lab.cli.sim gen --arrival gamma --cv 1.5 --rate 1.0 --input uniform:2048:28672 \
            --output uniform:32:512 --num 200 --prefix-groups 6 --prefix-len uniform:2048:12288 \
            --seed 7 --out build/long_prefix.jsonl
        python3 -m lab.cli.sim gen --arrival gamma --cv 1.5 --rate 1.0 --input uniform:4096:36864 \
            --output uniform:64:384 --num 200 --prefix-groups 12 --prefix-len uniform:1024:20480 \
            --seed 23 --out build/long_prefix_40k.jsonl
        python3 -m lab.cli.sim gen --arrival gamma --cv 1.5 --rate 1.0 --input uniform:6144:30720 \
            --output uniform:64:448 --num 200 --prefix-groups 8 --prefix-len uniform:1024:8192 \
            --seed 59 --out build/long_heldout.jsonl
        python3 -m lab.cli.sim trace window traces/azure_code.csv --skip 3345 --limit 300 \
            --out build/azure_code_busy.csv
        pid=$(serve_bg 18500 "$out/attribution_server.log" --max-prefill-tokens 2048 \
            --record-steps "$out/engine_steps_all.csv")
        if wait_ready http://127.0.0.1:18500 "$pid" 240; then
            for spec in ${ATTR_RUNS:-conv:traces/azure_conv.csv:250:2.0}; do
                IFS=: read -r name trace limit scale <<<"$spec"
                run "attr_${name}_x$scale" 400 python3 -m lab.cli.sim validate $cpu_flag "$trace" \
                    --url http://127.0.0.1:18500 --profile profiles/h200_llama-3.1-8b.csv \
                    --tokenizer .gpu/tokenizer --max-running 256 --max-prefill-tokens 2048 \
                    --limit "$limit" --rate-scale "$scale" --repeats "${ATTR_REPEATS:-1}" \
                    --no-report --no-progress --out "$out/attr_${name}_x$scale"
            done
        else
            tail -n 20 "$out/attribution_server.log"
        fi
        kill "$pid" 2>/dev/null
        wait "$pid" 2>/dev/null
        ;;
    cluster)  # two Qwen3-0.6B replicas sharing the GPU behind the in-process router, per policy
        # CLUSTER_PROFILE=FILE: that profile instead of measuring one; CLUSTER_MPS=1: the
        # replicas' processes share the GPU through the MPS daemon (started and stopped here)
        qprofile=${CLUSTER_PROFILE:-$out/h200_qwen3-0.6b.csv}
        qwen3_profile "$qprofile"
        if [ "${CLUSTER_MPS:-0}" = 1 ]; then
            nvidia-cuda-mps-control -d || { echo "MPS daemon did not start"; continue; }
        fi
        for policy in ${CLUSTER_POLICIES:-round_robin cache_aware}; do
            python3 -m lab.cli.engine serve --model qwen3-0.6b --dummy-weights \
                --tokenizer .gpu/tokenizer --device cuda --port 18600 --dp 2 --dp-share-gpu \
                --router "$policy" --record-steps "$out/cluster_${policy}_steps.csv" \
                >"$out/cluster_${policy}_server.log" 2>&1 &
            pid=$!
            if wait_ready http://127.0.0.1:18600 "$pid" 240; then
                run "cluster_$policy" $((150 * ${CLUSTER_REPEATS:-1} + 250)) python3 -m lab.cli.sim validate $cpu_flag \
                    "${CLUSTER_TRACE:-traces/mooncake_conversation.jsonl}" --url http://127.0.0.1:18600 \
                    --profile "$qprofile" --tokenizer .gpu/tokenizer --limit "${CLUSTER_LIMIT:-600}" \
                    --rate-scale "${CLUSTER_SCALE:-2}" --repeats "${CLUSTER_REPEATS:-1}" \
                    --no-report --no-progress \
                    ${CLUSTER_COLOCATION:+--colocation "$CLUSTER_COLOCATION"} --out "$out/cluster_$policy"
            else
                tail -n 20 "$out/cluster_${policy}_server.log"
            fi
            kill "$pid" 2>/dev/null
            wait "$pid" 2>/dev/null
        done
        [ "${CLUSTER_MPS:-0}" = 1 ] && echo quit | nvidia-cuda-mps-control
        ;;
    pd)  # a prefill and a decode server on one GPU against two colocated ones, real and simulated
        qprofile=${PD_PROFILE:-$out/h200_qwen3-0.6b.csv}
        qwen3_profile "$qprofile"
        if [ "${PD_MPS:-0}" = 1 ]; then
            nvidia-cuda-mps-control -d || { echo "MPS daemon did not start"; continue; }
        fi
        run pd 580 python3 benchmarks/pd_load.py --trace "${PD_TRACE:-traces/azure_conv.csv}" \
            --limit "${PD_LIMIT:-200}" --rates "${PD_RATES:-2,5}" --repeats "${PD_REPEATS:-1}" \
            --profile "$qprofile" --model qwen3-0.6b --threads 4 \
            --slo-ttft-ms "${PD_SLO_TTFT_MS:-500}" --slo-tpot-ms "${PD_SLO_TPOT_MS:-20}" \
            --serve-args "$GPU_SERVE --mem-fraction ${PD_MEM_FRACTION:-0.4}" \
            --validate-args "--tokenizer .gpu/tokenizer $cpu_flag${PD_COLOCATION:+ --colocation $PD_COLOCATION}" \
            --record-steps "$out/pd_steps" --out "$out/pd" --json "$out/pd_load.json"
        [ "${PD_MPS:-0}" = 1 ] && echo quit | nvidia-cuda-mps-control
        ;;
    capacity)  # the real engine's capacity against the simulator's, on a held-out trace
        mid_prefix_trace
        pid=$(serve_bg 18400 "$out/capacity_server.log" --max-prefill-tokens 2048 ${CAP_SERVE_ARGS:-})
        if wait_ready http://127.0.0.1:18400 "$pid" 240; then
            run capacity "${CAP_TIMEOUT:-560}" python3 -m lab.cli.sim validate $cpu_flag \
                "${CAP_TRACE:-build/mid_prefix.jsonl}" --rate-scale "${CAP_SCALE:-1}" \
                ${CAP_LIMIT:+--limit "$CAP_LIMIT"} \
                --url http://127.0.0.1:18400 --profile "${CAP_PROFILE:-profiles/h200_llama-3.1-8b.csv}" \
                --tokenizer .gpu/tokenizer --capacity --slo-ttft-ms "${CAP_TTFT_MS:-1000}" \
                --slo-tpot-ms "${CAP_TPOT_MS:-50}" --attainment 0.99 --tolerance 0.1 \
                --repeats "${CAP_REPEATS:-2}" --no-report \
                --no-progress --out "$out/capacity"
        else
            tail -n 20 "$out/capacity_server.log"
        fi
        kill "$pid" 2>/dev/null
        wait "$pid" 2>/dev/null
        ;;
    alone)  # a run at the edge recorded, then its steps' plans timed alone on the same machine
        mid_prefix_trace
        pid=$(serve_bg 18450 "$out/alone_server.log" --max-prefill-tokens 2048 \
            --record-steps "$out/alone_steps_all.csv" ${ALONE_SERVE_ARGS:-})
        if wait_ready http://127.0.0.1:18450 "$pid" 240; then
            run alone_run 200 python3 -m lab.cli.sim validate $cpu_flag "${ALONE_TRACE:-build/mid_prefix.jsonl}" \
                --rate-scale "${ALONE_SCALE:-1.3}" ${ALONE_LIMIT:+--limit "$ALONE_LIMIT"} \
                --url http://127.0.0.1:18450 \
                --profile profiles/h200_llama-3.1-8b.csv --tokenizer .gpu/tokenizer --repeats 1 \
                --no-report --no-progress --out "$out/alone_run"
        else
            tail -n 20 "$out/alone_server.log"
        fi
        kill "$pid" 2>/dev/null
        wait "$pid" 2>/dev/null
        run alone_plans 240 python3 -m lab.cli.engine profile --model llama-3.1-8b --dummy-weights \
            --tokenizer .gpu/tokenizer --device cuda --no-cpu-stages --max-prefill-tokens 2048 \
            --plans-from "$out/alone_run/real-1/engine_steps.csv" \
            --plans-per-kind "${ALONE_PLANS:-60}" --out "$out/alone_plans.csv"
        ;;
    tier)  # the host KV tier: a trace whose prefixes outgrow a small device pool, with and without
        python3 -m lab.cli.sim gen --rate "${TIER_RATE:-2.5}" --input uniform:8704:10240 \
            --output fixed:64 --num "${TIER_NUM:-200}" --prefix-groups 40 --prefix-len fixed:8192 \
            --seed 11 --out build/tier_reuse.jsonl
        tier_trace=${TIER_TRACE:-build/tier_reuse.jsonl}  # e.g. traces/mooncake_conversation.jsonl
        tier_args=${TIER_TRACE:+--limit ${TIER_LIMIT:-200} --rate-scale ${TIER_SCALE:-0.4}}
        for gb in ${TIER_GB:-0 48}; do
            pid=$(serve_bg 18700 "$out/tier_gb${gb}_server.log" --num-pages "${TIER_PAGES:-2048}" \
                --host-kv-gb "$gb" --record-steps "$out/tier_gb${gb}_steps_all.csv" ${TIER_SERVE_ARGS:-})
            if wait_ready http://127.0.0.1:18700 "$pid" 240; then
                run "tier_gb$gb" "${TIER_TIMEOUT:-300}" python3 -m lab.cli.sim validate $cpu_flag "$tier_trace" $tier_args \
                    --url http://127.0.0.1:18700 --profile profiles/h200_llama-3.1-8b.csv \
                    --tokenizer .gpu/tokenizer --max-running 256 --repeats 1 --no-report \
                    --no-progress --out "$out/tier_gb$gb"
            else
                tail -n 20 "$out/tier_gb${gb}_server.log"
            fi
            kill "$pid" 2>/dev/null
            wait "$pid" 2>/dev/null
        done
        ;;
    scatter)  # steps whose decode rows stay with the chunk, pages contiguous then scattered
        for pages in contiguous scattered; do
            run "scatter_$pages" 200 python3 -m lab.cli.engine profile --model llama-3.1-8b \
                --dummy-weights --tokenizer .gpu/tokenizer --device cuda --no-cpu-stages \
                --prefill-tokens 512,1024,2048 --prefill-prefixes 0,4096 --prefill-chunks 1 \
                --decode-batches 8,32,64,128 --decode-contexts 512,2048,6144 \
                --mixed-prefill 1024,2048 --mixed-prefixes 0,4096 --mixed-batches 8,32,64,128 \
                --mixed-contexts 512,2048,6144 --holdout 0 --max-seconds 150 \
                $([ "$pages" = scattered ] && echo --scatter-pages) --out "$out/scatter_$pages.csv"
        done
        ;;
    tokcopy) run tokcopy 300 python3 benchmarks/gpu/tokenize_beside_copies.py \
        --tokenizer .gpu/tokenizer --out "$out/tokcopy.json" ;;
    fastmax)  # FlashInfer's plan() with and without the tensor max, each twice in one run
        run fastmax_runner 300 python3 benchmarks/gpu/runner.py --skip-prefill \
            --variants fused,slow-max,fused,slow-max --batches 1,64,256 --contexts 1024 \
            --out "$out/fastmax_runner_llama8b.json"
        for v in 1 0; do
            SERVELAB_FLASHINFER_FAST_MAX=$v run "fastmax_overlap_$v" 150 \
                python3 benchmarks/gpu/overlap.py --batch 256 --out "$out/fastmax_overlap_$v.json"
        done
        ;;
    split)  # decode rows planned apart from the chunk (long ones cut into pieces) or not, twice each
        for v in ${SPLIT_VARIANTS:-0 1 0 1} ${SPLIT_EAGER:+eager}; do
            n=$(ls "$out" | grep -c "^split_${v}_.*csv$")
            graph=$([ "$v" = eager ] && echo --no-cuda-graph)
            SERVELAB_SPLIT_DECODE_ROWS=${v/eager/1} run "split_${v}_$n" 240 python3 -m lab.cli.engine profile $graph \
                --model llama-3.1-8b --dummy-weights --tokenizer .gpu/tokenizer --device cuda \
                --no-cpu-stages --prefill-tokens 2048 --prefill-prefixes 0 --prefill-chunks 1 \
                --decode-batches 8,16,17,24,25,32,64 --decode-contexts 1024,4096,16384,32768,120000 \
                --mixed-prefill 256,2048 --mixed-contexts 1024,4096,32768 --mixed-batches 1,8,16,64 \
                --holdout 0 --repeats 5 \
                --out "$out/split_${v}_$n.csv"
        done
        ;;
    serve)
        run serve_llama 300 python3 benchmarks/gpu/serve.py --model llama-3.1-8b \
            --out "$out/serve_llama8b.json"
        run serve_llama_no_overlap 240 python3 benchmarks/gpu/serve.py --model llama-3.1-8b \
            --hf-batch 0 --port 18300 --out "$out/serve_llama8b_no_overlap.json" \
            --serve-args --no-overlap
        run serve_qwen3 240 python3 benchmarks/gpu/serve.py --model qwen3-0.6b --port 18200 \
            --out "$out/serve_qwen3.json"
        ;;
    ragged)  # decodes past the long grid's 16k rows (the long-prompt traces reach 29-31k)
        run ragged 300 python3 -m lab.cli.engine profile --model llama-3.1-8b --dummy-weights \
            --tokenizer .gpu/tokenizer --device cuda --no-cpu-stages --max-seconds 200 \
            --prefill-tokens 2048 --prefill-prefixes 0 --prefill-chunks 1 \
            --decode-batches 2,4,8,16,17,24,25,32 --decode-contexts 1024,8192,16384,24576,32768 \
            --ragged-longest 16384,24576,32768 --mixed-prefill 2048 --mixed-prefixes 0 \
            --mixed-batches 8 --mixed-contexts 16384 --holdout 30 --out "$out/ragged32k.csv"
        ;;
    profile)  # the long grid
        run profile 480 python3 -m lab.cli.engine profile --model llama-3.1-8b --dummy-weights \
            --tokenizer .gpu/tokenizer --device cuda --max-seconds "${PROFILE_SECONDS:-330}" $LONG_GRID \
            --out "$out/h200_llama-3.1-8b.csv"
        ;;
    validate)
        profile_csv=${PROFILE:-$out/h200_llama-3.1-8b.csv}
        if [ -z "${PROFILE:-}" ]; then
            run profile 300 python3 -m lab.cli.engine profile --model llama-3.1-8b --dummy-weights \
                --tokenizer .gpu/tokenizer --device cuda --max-seconds "${PROFILE_SECONDS:-240}" \
                $LONG_GRID --out "$profile_csv"
        fi
        pid=$(serve_bg 18400 "$out/validate_server.log")
        if wait_ready http://127.0.0.1:18400 "$pid" 240; then
            for x in $RATES; do
                run "validate_rate$x" 200 python3 -m lab.cli.sim validate $cpu_flag traces/azure_conv.csv \
                    --url http://127.0.0.1:18400 --profile "$profile_csv" \
                    --tokenizer .gpu/tokenizer --max-running 256 --limit "$LIMIT" \
                    --rate-scale "$x" --repeats 2 --no-report --no-progress \
                    --out "$out/validate_rate$x"
                cp "$out/validate_rate$x/comparison.json" "$out/comparison_rate$x.json"
            done
        else
            tail -n 20 "$out/validate_server.log"
        fi
        kill "$pid" 2>/dev/null
        wait "$pid" 2>/dev/null
        ;;
    layouts)
        run layouts 580 python3 benchmarks/layout_load.py \
            --trace "${LAYOUT_TRACE:-traces/azure_conv.csv}" --limit "${LAYOUT_LIMIT:-250}" \
            --rates "${LAYOUT_RATES:-2,5,10}" --repeats "${LAYOUT_REPEATS:-1}" \
            "${GPU_LOAD_ARGS[@]}" $cpu_flag --out "$out/layouts"
        ;;
    tokscale)
        python3 -m lab.cli.sim gen --rate 60 --input uniform:16640:16896 --output fixed:16 \
            --num 300 --prefix-groups 1 --prefix-len fixed:16384 --seed 7 --out build/tokbound.jsonl
        for round in $(seq "${TOKSCALE_ROUNDS:-1}"); do
            run "tokscale_r$round" 580 python3 benchmarks/layout_load.py \
                --trace build/tokbound.jsonl --layouts split --rates 1 --repeats 1 \
                --num-tokenizers "${TOKSCALE_WORKERS:-1,2,4}" "${GPU_LOAD_ARGS[@]}" $cpu_flag \
                --out "$out/tokscale_r$round"
        done
        ;;
    layout_ab)
        run layout_ab 580 python3 benchmarks/layout_ab.py --model llama-3.1-8b \
            --tokenizer .gpu/tokenizer --serve-args "$GPU_SERVE" \
            --profile profiles/h200_llama-3.1-8b.csv --b-tokens 32000 \
            --budgets "${AB_BUDGETS:-512,2048}" --repeats "${AB_REPEATS:-2}" --num-pages 8192 \
            --threads 4 --a-tokens-before 32 --a-tokens-after 400 --out-dir "$out/layout_ab" \
            --json "$out/layout_ab_h200.json"
        ;;
    *) echo "unknown part $part" ;;
    esac
done
