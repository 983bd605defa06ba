#!/usr/bin/env bash
# The GPU check in one command: on one H100 or H200, in two calls of at most 7 minutes, the most valuable
# figures first: the demo through NCCL (does its step replay?), the published GEARS side by
# side, epochs at Norman size, a torchrun job resumed from its GPU checkpoint, the replayed
# step's top kernels (torch.profiler), the suite's CUDA tests, then fp16 and batch 256, a
# step at 18,000 genes and a 1,225-pair screen; one archive of logs and JSON.
#
#     bash benchmarks/gpu_check.sh [--small]        every stage; the archive gpu_check.tar.gz
#     bash benchmarks/gpu_check.sh --stages tests,published   these stages only (environment
#                                                   and wheels always run first)
#     bash benchmarks/gpu_check.sh --download-wheels  the wheels the GPU machine lacks, into .whl/
#
# --small runs the same stages at small sizes on a CPU, its OpenMP threads waiting passively
# (OMP_WAIT_POLICY=PASSIVE unless set); tests/test_gpu_check.py runs it in the suite. The
# archive (gpu_check.tar.gz: the folder gpu_check/ of every stage's log and JSON,
# summary.json and summary.txt) and summary.json beside it go to $OUT when it is set, else
# to the current folder; the data and runs are written under $GPU_CHECK_WORK (default: a new
# temporary folder, removed at the end). The script ends with a table of each stage's key
# figures, exit status, wall and CPU seconds and time limit, and exits 1 when a stage failed.
# Other settings: PYTHON (default python3), GPU_CHECK_WHEELS (default .whl/),
# GPU_CHECK_TEST_WORKERS (pytest-xdist workers of the tests stage, default 8).
#
# On the workplace's device machine (no package index there: the packages it lacks travel
# as wheels), from the repository root:
#
#     here, once:   bash benchmarks/gpu_check.sh --download-wheels      (.whl/ is ignored by git)
#     device tool:  run(command="bash benchmarks/gpu_check.sh --stages ...", carry=[".whl"], timeout_s=480)
#
# and the reply's files are gpu_check.tar.gz and summary.json (at most 8 files come back;
# everything else is inside the archive). All the stages' budgets together (about 13
# minutes) are more than one call may take (10 minutes) and than a task's 15 minutes of
# device time hold beside the machine's start: run them in two calls, in two sessions where
# one has too little time left, each giving the machine back after it:
#
#     --stages demo,published,tests                          (at most 6.5 minutes)
#     --stages epoch,resume,profile,precision,width,screen   (at most 6.75 minutes)
#
# Each benchmark's child processes (bench_model.py's two sides, say) write their output
# to files under children/ in the archive as they run (BENCH_CHILD_LOGS), so a stage cut
# short still shows how far each got.
# benchmarks/RESULTS.md says how its figures are recorded.
#
# The GPU machine's image has torch with CUDA, torch-geometric, numpy, scipy, scikit-learn,
# numba, h5py, matplotlib, statsmodels, seaborn, pytest-xdist and pandas 3, but not anndata
# (whose 0.12 needs pandas < 3), scanpy or the published GEARS. The wheels below, for
# CPython 3.12 on x86-64, are what they need beyond the image (each one's Requires-Dist read
# from the wheel); when $GPU_CHECK_WHEELS (default .whl/) holds wheels, the wheels stage
# installs them with pip, no index and no dependencies, into a folder put first on
# PYTHONPATH, before the repository itself (gears_ddp runs from the checkout, installed by
# nothing: `pip install -e` would look for its dependencies on an index).
WHEELS=(
    pandas==2.3.3 pytz==2026.6 tzdata==2026.6                       # pandas < 3, for anndata
    anndata==0.12.19 zarr==3.1.6 numcodecs==0.16.6 donfig==0.8.1.post1 google-crc32c==1.9.0
    array-api-compat==1.16.0 legacy-api-wrap==1.5 natsort==8.4.0 scverse-misc==0.0.3
    scanpy==1.11.5 session-info2==0.4.1 pynndescent==0.7.0 umap-learn==0.5.12
    scikit-misc==0.5.3                                                # scanpy's seurat_v3 genes
    cell-gears==0.1.2 dcor==0.7                                       # the published GEARS
    optuna==5.1.0 alembic==1.20.1 sqlalchemy==2.1.9 mako==1.4.3 colorlog==6.12.0  # sweeps (its tests' imports)
)
#
# Stages, in order, each with its budget in seconds (a stage that ends early leaves the
# seconds it did not use to the stages after it, so together they take at most the sum of
# those chosen and the wait for the data stage, and a slow stage cannot eat the others' own
# budgets; --small gives each 300 s, which on a CPU only stops a stage that hangs). A stage
# that fails or runs out of time is recorded with its exit status (124: out of time) and the
# next one runs; the benchmarks write their JSON after each row, so a stage cut short keeps
# the rows it finished. The budgets come from
# the check of 2026-12-04 on an H200, where every stage ran to its end (demo 25 s, published
# 134 s, tests 90 s; resume 43 s, epoch 45 s, profile 40 s with compile on, precision 59 s,
# width 42 s; the data stage 81 s beside them), with a margin of about 1.3x; the screen's
# 5,151 pairs took 105 s of its 126, more than a call holds beside the others, so it screens
# 50 genes' 1,225 pairs (about 25 s at the 49 pairs/s measured, and 21 s of set-up), then
# Norman's 5,151 on the same model only where the 1,225's rate says they take at most 30 s.
#
#   environment  10  nvidia-smi; Python, torch, CUDA, cuDNN, NCCL, the GPU        env.json
#   wheels       25  install .whl/ (if any) and compile their bytecode and the checkout's, as a
#                    user's pip install does; the versions of setup.py's requirements and the
#                    published GEARS's, read from their metadata; fails when one that setup.py
#                    asks for is missing or too old (importing scanpy's numba code took 20 s
#                    of the first run's 42: not imported)                          wheels.json
#   data        240  beside the stages after demo and published, on a few CPU cores: the
#                    datasets of epoch (also the profile's), width and screen (their scripts'
#                    --data-only). Never beside demo or published, whose times are figures: on
#                    the H200 (2026-12-04) gears_ddp's epoch beside it took 5.46 s, 1.29 s alone
#   demo         50  gears-ddp demo as it comes, through NCCL, timed end to end; whether its
#                    steps replayed, from its log (--small: 1 epoch)        demo_report.json
#   published   175  benchmarks/bench_model.py on the GPU: one epoch of 18,000 cells x 2,000
#                    genes, the published GEARS beside gears_ddp (no published GEARS: gears_ddp
#                    alone, said so)                                             published.json
#   resume       55  benchmarks/bench_resume.py: a torchrun job killed (SIGKILL, torchrun and
#                    its workers) once its checkpoint of step 30 is written, then resumed
#                    from its newest checkpoint (resume/: both jobs' logs)         resume.json
#                    (first of its call: it reads none of the data stage's datasets, and the
#                    epoch stage, which waits for them, would otherwise wait on the GPU idle)
#   epoch        65  benchmarks/bench_epoch.py at Norman size (90,500 cells x 5,000 genes),
#                    CUDA graphs, batch 32, fp32 and bf16, 2 epochs each (the second timed)
#                                                                          epoch_graphs.json
#   profile      55  benchmarks/bench_step_profile.py on the epoch's data: the replayed
#                    step's top kernels, its time and its products' floor, compile off and
#                    on (inductor's fused kernels under the graph)             profile.json
#   tests       130  GEARS_DDP_TEST_DEVICES=cuda pytest -k cuda tests/ (xdist workers when
#                    pytest-xdist is there; two ranks sharing the GPU replay two graphs a step
#                    around their all-reduce among them); --small: the CPU cases of the
#                    CUDA-graph and padded-set tests                                tests.xml
#   precision    75  bench_epoch.py as above: fp16 at batch 32, then fp32 and bf16 at 256
#                                                          epoch_fp16.json, epoch_256.json
#   width        55  benchmarks/bench_width.py on the GPU at 18,000 genes, gears_ddp alone,
#                    fp32 and bf16 steps                                             width.json
#   screen       65  benchmarks/bench_screen.py: 50 genes' 1,225 pairs on GPU 0,    screen.json
#                    then 102 genes' 5,151 where they fit in 30 s (--small: 45, then 66)
set -uo pipefail  # no -e: a failed stage is recorded and the next one runs

SELF=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/$(basename "${BASH_SOURCE[0]}")
REPO=$(cd "$(dirname "$SELF")/.." && pwd)
PYTHON=${PYTHON:-python3}
WHEEL_DIR=${GPU_CHECK_WHEELS:-$REPO/.whl}
BENCH=$REPO/benchmarks

STAGES=(environment wheels demo published resume epoch profile tests precision width screen)
declare -A BUDGET=([environment]=10 [wheels]=25 [data]=240 [demo]=50 [published]=175 [epoch]=65 [resume]=55
                   [profile]=55 [tests]=130 [precision]=75 [width]=55 [screen]=65)
DATA_STAGES=" epoch profile precision width screen "  # the stages that read the data stage's datasets
TIMED_ALONE=" environment wheels demo published "  # the stages the data stage never runs beside
SMALL_BUDGET=300
MIN_LIMIT=10  # the least time a stage is given, even when those before it overran

usage() {  # the comment at the top, up to the wheels
    sed -n '2,/^[^#]/p' "$SELF" | sed '$d; s/^# \{0,1\}//'
}

download_wheels() {
    # CPython 3.12 wheels for x86-64 Linux, the platform tags the device machine's notes name
    mkdir -p "$WHEEL_DIR"
    python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d "$WHEEL_DIR" "${WHEELS[@]}"
}

# ----------------------------------------------------------------------------- the sizes

# Options of each benchmark: the GPU's sizes, or --small's (a few hundred cells and genes).
sizes() {
    if (( SMALL )); then
        case $1 in
            epoch|profile) echo --genes 200 --cells-per-condition 30 --perturbed-genes 10 --combos 10 \
                                --control-cells 300 ;;
            width) echo --genes 300 --cells-per-condition 20 --perturbed-genes 10 --combos 5 --control-cells 200 \
                        --modules 5 --steps 3 ;;
            screen) echo --genes 300 --screen-genes 10 --larger-screen-genes 12 --train-steps 2 ;;
            resume) echo --genes 200 --cells-per-condition 20 --perturbed-genes 10 --combos 10 --control-cells 300 \
                         --kill-after 6 --checkpoint-every 3 ;;
            published) echo --genes 200 --cells-per-condition 10 --perturbed-genes 10 --combos 10 --control-cells 200 ;;
        esac
    else
        case $1 in
            epoch|profile) echo ;;  # bench_epoch's defaults (and the profile's): Norman size
            width) echo --steps 20 ;;  # bench_width's defaults: 11,000 cells x 18,000 genes
            # 1,225 pairs on a model of Norman's 5,045 genes, then Norman's 5,151 if they fit in 30 s
            screen) echo --screen-genes 50 --larger-screen-genes 102 --larger-screen-limit-s 30 ;;
            resume) echo ;;  # bench_resume's defaults: 7,300 cells x 1,000 genes, killed after step 30
            published) echo --genes 2000 --cells-per-condition 120 --control-cells 1200 ;;  # 18,000 cells
        esac
    fi
}

# ----------------------------------------------------------------------------- the stages
# Each runs in a process of its own (this script with --stage NAME) under `timeout`, in
# $WORK, its output to $RESULTS/NAME.log.

stage_environment() {
    if command -v nvidia-smi > /dev/null; then
        nvidia-smi
        nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv \
            > "$RESULTS/nvidia-smi.csv"
    else
        echo "nvidia-smi: not on this machine"
    fi
    uname -a
    echo "cores: $(nproc)"
    "$PYTHON" "$BENCH/gpu_check_report.py" environment "$RESULTS/env.json" --nvidia-smi "$RESULTS/nvidia-smi.csv"
}

stage_wheels() {
    if compgen -G "$WHEEL_DIR/*.whl" > /dev/null; then
        echo "installing $(ls "$WHEEL_DIR"/*.whl | wc -l) wheels from $WHEEL_DIR into $SITE"
        "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
            "$WHEEL_DIR"/*.whl || return
    else
        echo "no wheels in $WHEEL_DIR: the packages this Python has"
    fi
    # bytecode for the wheels and the checkout, as a user's pip install leaves it; without it each
    # process of the check compiles what it imports, and again in every process where Python may
    # not write bytecode (PYTHONDONTWRITEBYTECODE): 0.8 s an import of gears_ddp on 2 cores
    local compiled=("$REPO/gears_ddp")
    if [[ -d $SITE ]]; then compiled+=("$SITE"); fi
    "$PYTHON" -m compileall -q -j 0 "${compiled[@]}" > /dev/null || echo "compileall: some files did not compile"
    "$PYTHON" "$BENCH/gpu_check_report.py" packages "$RESULTS/wheels.json" --wheels "$WHEEL_DIR"
}

stage_data() {
    local pids=() failed=0
    "$PYTHON" "$BENCH/bench_epoch.py" --data-only --data-path "$WORK/data/epoch" $(sizes epoch) &
    pids+=($!)
    "$PYTHON" "$BENCH/bench_width.py" --data-only --data-path "$WORK/data/width" $(sizes width) &
    pids+=($!)
    "$PYTHON" "$BENCH/bench_screen.py" --data-only --data-path "$WORK/data/screen" $(sizes screen) &
    pids+=($!)
    for pid in "${pids[@]}"; do
        wait "$pid" || failed=1
    done
    return $failed
}

stage_tests() {
    cd "$REPO" || return
    local common=(-q -p no:cacheprovider --timeout 300 --junitxml "$RESULTS/tests.xml")
    if (( SMALL )); then  # the same stage on a CPU, never tests/test_gpu_check.py (no recursion)
        GEARS_DDP_TEST_DEVICES=cpu "$PYTHON" -m pytest "${common[@]}" -k "cpu and (cuda_graphs or padded)" \
            tests/test_cuda_graphs.py tests/test_padded_sets.py
        return
    fi
    local workers=()
    if "$PYTHON" -c "import xdist" 2> /dev/null; then  # the workers' OpenMP threads sleep while they wait
        workers=(-n "${GPU_CHECK_TEST_WORKERS:-8}")
        export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
    fi
    # a failing torch.compile prints dynamo's whole stack (TORCHDYNAMO_VERBOSE)
    TORCHDYNAMO_VERBOSE=1 GEARS_DDP_TEST_DEVICES=cuda "$PYTHON" -m pytest "${common[@]}" "${workers[@]}" -k cuda \
        --ignore tests/test_gpu_check.py tests/
}

stage_demo() {
    local epochs=()
    if (( SMALL )); then epochs=(--epochs 1); fi
    "$PYTHON" -m gears_ddp demo --data-path "$WORK/data/demo" --save-path "$WORK/runs/demo" "${epochs[@]}" \
        || return
    cp "$WORK/runs/demo/report.json" "$RESULTS/demo_report.json"
}

stage_resume() {
    "$PYTHON" "$BENCH/bench_resume.py" --data-path "$WORK/data/resume" --logs "$RESULTS/resume" \
        --json "$RESULTS/resume.json" $(sizes resume)
}

stage_epoch() {  # the second of 2 epochs is timed, after the capture (--small: 1 epoch)
    local epochs=2
    if (( SMALL )); then epochs=1; fi
    "$PYTHON" "$BENCH/bench_epoch.py" --data-path "$WORK/data/epoch" $(sizes epoch) --cuda-graphs on \
        --amp off bf16 --batch-sizes 32 --epochs $epochs --json "$RESULTS/epoch_graphs.json"
}

stage_profile() {  # --small: no compile (inductor's C++ build takes minutes on a small CPU)
    local steps=20 compile=(off on)
    if (( SMALL )); then steps=3 compile=(off); fi
    "$PYTHON" "$BENCH/bench_step_profile.py" --device "$DEVICE" --data-path "$WORK/data/epoch" $(sizes profile) \
        --compile "${compile[@]}" --steps $steps --json "$RESULTS/profile.json"
}

stage_precision() {  # fp16 at batch 32, then batch 256 (one JSON: the second run adds its rows)
    local bench=("$PYTHON" "$BENCH/bench_epoch.py" --data-path "$WORK/data/epoch" $(sizes epoch) --cuda-graphs on)
    local epochs=2
    if (( SMALL )); then epochs=1; fi
    "${bench[@]}" --amp fp16 --batch-sizes 32 --epochs $epochs --json "$RESULTS/epoch_fp16.json" || return
    "${bench[@]}" --amp off bf16 --batch-sizes 256 --epochs $epochs --json "$RESULTS/epoch_256.json"
}

stage_width() {
    "$PYTHON" "$BENCH/bench_width.py" --device "$DEVICE" --skip-reference --amp off bf16 \
        --data-path "$WORK/data/width" --json "$RESULTS/width.json" $(sizes width)
}

stage_screen() {
    local devices=()
    if [[ $DEVICE == cuda ]]; then devices=(--gpu-ids 0); fi
    "$PYTHON" "$BENCH/bench_screen.py" --parts screen --published-screen-pairs 0 "${devices[@]}" \
        --data-path "$WORK/data/screen" --json "$RESULTS/screen.json" $(sizes screen)
}

stage_published() {  # says itself when the published GEARS is not there to run beside it
    "$PYTHON" "$BENCH/bench_model.py" --device "$DEVICE" --epochs 1 --eval-repeats 1 \
        --json "$RESULTS/published.json" $(sizes published)
}

# ----------------------------------------------------------------------------- running them

BANK=0  # seconds the stages so far left unused
FAILED=()

limit_of() {  # the seconds stage $1 may take: its budget and what the stages before left
    local budget=${BUDGET[$1]} limit
    if (( SMALL )); then budget=$SMALL_BUDGET; fi
    limit=$(( budget + BANK ))
    echo $(( limit < MIN_LIMIT ? MIN_LIMIT : limit ))
}

now_ms() {
    echo $(( $(date +%s%N) / 1000000 ))
}

record() {  # record NAME RC MILLISECONDS CPU_SECONDS LIMIT: a line of stages.tsv, and the console's
    local seconds
    seconds=$(printf '%d.%03d' $(( $3 / 1000 )) $(( $3 % 1000 )))
    printf '%s\t%s\t%s\t%s\t%s\n' "$1" "$2" "$seconds" "$4" "$5" >> "$RESULTS/stages.tsv"
    if (( $2 == 0 )); then
        echo "[$1] done in $seconds s (CPU $4 s; limit $5 s)"
    else
        FAILED+=("$1")
        echo "[$1] FAILED with exit status $2$( (( $2 == 124 )) && echo ', out of time') after $seconds s" \
             "(limit $5 s); the end of $1.log:"
        tail -n 20 "$RESULTS/$1.log" | sed 's/^/    /'
    fi
}

run_in_stage() {  # run_in_stage NAME LIMIT: this script's stage NAME under timeout, in $WORK
    # timeout runs the stage in a process group of its own, and stops the whole group; its
    # process id goes to $WORK/NAME.pid (exec keeps the subshell's)
    (
        echo "$BASHPID" > "$WORK/$1.pid"
        cd "$WORK" && exec timeout --signal=INT --kill-after=10 "$2" bash "$SELF" --stage "$1" \
            > "$RESULTS/$1.log" 2>&1
    )
}

timed_stage() {  # timed_stage NAME LIMIT: run_in_stage; writes "rc end_ms cpu_seconds" to $WORK/NAME.status
    local rc cpu user system TIMEFORMAT='%U %S'
    cpu=$( { time run_in_stage "$1" "$2" 2> /dev/null; } 2>&1 )
    rc=$?
    read -r user system <<< "$cpu"
    echo "$rc $(now_ms) $(awk -v u="$user" -v s="$system" 'BEGIN { printf "%.1f", u + s }')" > "$WORK/$1.status"
}

run_stage() {  # run_stage NAME: run it, record it, and carry what it left unused
    local limit start rc end cpu elapsed
    limit=$(limit_of "$1")
    echo "[$1] started, limit $limit s"
    start=$(now_ms)
    timed_stage "$1" "$limit"
    read -r rc end cpu < "$WORK/$1.status"
    elapsed=$(( end - start ))
    record "$1" "$rc" "$elapsed" "$cpu" "$limit"
    BANK=$(( limit - (elapsed + 999) / 1000 ))
    if (( BANK < 0 )); then BANK=0; fi
}

DATA_PID=""  # the data stage, while it runs in the background
DATA_START=0
DATA_LIMIT=0
start_data() {
    DATA_LIMIT=${BUDGET[data]}
    if (( SMALL )); then DATA_LIMIT=$SMALL_BUDGET; fi
    echo "[data] started beside the next stages, limit $DATA_LIMIT s"
    DATA_START=$(now_ms)
    timed_stage data "$DATA_LIMIT" &
    DATA_PID=$!
}

wait_for_data() {  # wait for the data stage and record it
    # the wait is taken from what the stages before left unused, never from the next stage's own
    # budget: a call whose first stage reads the data (--stages profile) waits the data stage's
    # whole time, and on the H200 (2026-12-04) a profile stage given the least limit was stopped
    if [[ -z $DATA_PID ]]; then return; fi
    local waited rc end cpu
    waited=$(now_ms)
    wait "$DATA_PID"
    DATA_PID=""
    BANK=$(( BANK - ($(now_ms) - waited) / 1000 ))
    if (( BANK < 0 )); then BANK=0; fi
    read -r rc end cpu < "$WORK/data.status"
    record data "$rc" "$(( end - DATA_START ))" "$cpu" "$DATA_LIMIT"
}

finish() {  # the summary and the archive, whatever happened before; exit 1 if a stage failed
    local status=$?
    trap - EXIT INT TERM
    if [[ -n $DATA_PID ]]; then  # stopped early: stop the data stage too (timeout passes INT on)
        kill -INT "$(cat "$WORK/data.pid")" 2> /dev/null
        wait_for_data
    fi
    if ! "$PYTHON" "$BENCH/gpu_check_report.py" summary "$RESULTS" | tee "$RESULTS/summary.txt"; then
        echo "gpu_check.sh: the summary failed (its traceback above); the stages' logs are in the archive" >&2
        FAILED+=(summary)
    fi
    tar -czf "$DEST/gpu_check.tar.gz" -C "$WORK" gpu_check && cp "$RESULTS/summary.json" "$DEST/summary.json"
    echo "archive: $DEST/gpu_check.tar.gz"
    if [[ -n ${REMOVE_WORK:-} ]]; then rm -rf "$WORK"; fi
    if (( ${#FAILED[@]} )); then status=1; fi
    exit "$status"
}

choose_stages() {  # choose_stages "a,b c": STAGES becomes environment, wheels and those, in STAGES's order
    local asked=" ${1//,/ } " stage chosen=(environment wheels)
    for stage in $asked; do
        if [[ " ${STAGES[*]} " != *" $stage "* ]]; then
            echo "gpu_check.sh: no stage '$stage'; the stages: ${STAGES[*]}" >&2
            return 2
        fi
    done
    for stage in "${STAGES[@]:2}"; do
        if [[ $asked == *" $stage "* ]]; then chosen+=("$stage"); fi
    done
    STAGES=("${chosen[@]}")
}

reads_data() {  # whether a chosen stage reads the data stage's datasets
    local stage
    for stage in "${STAGES[@]}"; do
        if [[ $DATA_STAGES == *" $stage "* ]]; then return 0; fi
    done
    return 1
}

main() {
    SMALL=0
    local chosen=""
    while (( $# )); do
        case $1 in
            --small) SMALL=1 ;;
            --stages) chosen=${2:-}; shift; if [[ -z $chosen ]]; then usage >&2; exit 2; fi ;;
            --download-wheels) download_wheels; exit ;;
            -h|--help) usage; exit 0 ;;
            *) usage >&2; exit 2 ;;
        esac
        shift
    done
    if [[ -n $chosen ]]; then choose_stages "$chosen" || exit 2; fi
    if [[ -z ${GPU_CHECK_WORK:-} ]]; then
        GPU_CHECK_WORK=$(mktemp -d "${TMPDIR:-/tmp}/gpu_check.XXXXXX")
        REMOVE_WORK=1
    fi
    export SMALL PYTHON REPO BENCH WHEEL_DIR
    export WORK=$GPU_CHECK_WORK RESULTS=$GPU_CHECK_WORK/gpu_check SITE=$GPU_CHECK_WORK/site
    export PYTHONPATH=$SITE:$REPO${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
    export BENCH_CHILD_LOGS=$RESULTS/children  # each benchmark child's output, as it runs
    if (( SMALL )); then  # on a small shared CPU, OpenMP threads that spin while they wait cost the most
        export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
    fi
    DEST=${OUT:-$PWD}
    rm -rf "$RESULTS"
    mkdir -p "$RESULTS" "$SITE" "$DEST" || exit
    : > "$RESULTS/stages.tsv"
    DEVICE=$("$PYTHON" -c 'import torch; print("cuda" if torch.cuda.is_available() else "cpu")') || exit
    export DEVICE
    trap finish EXIT
    trap 'exit 130' INT TERM
    echo "GPU check$( (( SMALL )) && echo ', small') on $DEVICE; work folder $WORK; archive to $DEST"
    local data_started=0
    for stage in "${STAGES[@]}"; do
        if (( ! data_started )) && [[ $TIMED_ALONE != *" $stage "* ]] && reads_data; then
            start_data
            data_started=1
        fi
        if [[ $DATA_STAGES == *" $stage "* ]]; then wait_for_data; fi
        run_stage "$stage"
    done
    exit 0  # finish (the EXIT trap) sets the status
}

if [[ ${1:-} == --stage ]]; then  # one stage, in a process of its own (run_in_stage)
    "stage_$2"
    exit
fi
main "$@"
