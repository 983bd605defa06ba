#!/usr/bin/env bash
# The GPU check rehearsed on this CPU, in an environment like the GPU machine's, before any
# device time is spent on it. `gpu_check.sh --small` in the suite runs in CI's environment,
# where everything setup.py asks for is installed; the GPU machine has only its image's
# packages and the wheels carried to it, and runs gears_ddp from the checkout. A wheel nobody
# carried, or a test module that does not import there, costs a whole stage of a 15-minute
# loan; here it costs a few CPU minutes.
#
#     bash benchmarks/gpu_check_rehearsal.sh [--stages a,b,...]   (default: every stage)
#
# 1. a virtualenv, .versions/gpu-image-<Python>/ (ignored by git), with Python 3.12 (PYTHON
#    to give another) and the packages of the GPU machine's image that gears_ddp, its tests
#    and benchmarks import, at the versions seen there (IMAGE below; torch a CUDA build from
#    the package index, run on the CPU: GBs, once), and neither gears_ddp nor the wheels;
# 2. the wheels of gpu_check.sh, downloaded into .whl/ (GPU_CHECK_WHEELS) where not there yet;
# 3. `benchmarks/gpu_check.sh --small` with that Python: its wheels stage installs the wheels
#    into a folder of its own, first on PYTHONPATH, as on the GPU machine (the archive and
#    summary.json to <virtualenv>/gpu_check/);
# 4. the GPU's tests stage's selection (`pytest -k cuda`, every test module but
#    tests/test_gpu_check.py) collected with those wheels on the path: a test module that
#    does not import there fails here.
# Exits 1 when the check or the collection failed. Record a rehearsal that found something
# in benchmarks/RESULTS.md.
set -euo pipefail
cd "$(dirname "$0")/.."

# the GPU machine's image (the workplace's notes, 2026-11): Python 3.12, and of what it holds,
# what gears_ddp, its tests and benchmarks import, and what the wheels of gpu_check.sh require
# and do not carry (each wheel's Requires-Dist); unpinned where no version was seen there
IMAGE=(
    torch==2.11.0 torch-geometric==2.8.0.post1 numpy==2.5.2 "pandas>=3,<4" scipy scikit-learn
    numba llvmlite h5py matplotlib seaborn statsmodels patsy networkx pyyaml tqdm joblib
    packaging python-dateutil markupsafe typing-extensions pytest pytest-timeout pytest-xdist
    setuptools wheel
)

stages=()
case "${1:-}" in
    --stages) stages=(--stages "${2:?--stages needs a list of stages}") ;;
    "") ;;
    *) sed -n '2,/^[^#]/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2; exit 2 ;;
esac
python=${PYTHON:-python3.12}
command -v "$python" > /dev/null || { echo "no $python on PATH: PYTHON=... to give the Python the GPU machine has" >&2; exit 2; }
python_version=$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
venv=$PWD/.versions/gpu-image-$python_version  # absolute: the check runs its stages in a folder of its own
wheels=$(realpath -m "${GPU_CHECK_WHEELS:-.whl}")

# made once, and again when IMAGE changes (the list it was made from is kept in it)
if [[ "$(cat "$venv/image.txt" 2> /dev/null)" != "$(printf '%s\n' "${IMAGE[@]}")" ]]; then
    rm -rf "$venv"
    "$python" -m venv "$venv"
    "$venv/bin/python" -m pip install -q uv
    VIRTUAL_ENV="$venv" "$venv/bin/uv" pip install -q "${IMAGE[@]}"
    printf '%s\n' "${IMAGE[@]}" > "$venv/image.txt"
fi
# those present are kept; pip's output shown only when it failed
GPU_CHECK_WHEELS=$wheels bash benchmarks/gpu_check.sh --download-wheels > "$venv/download.log" 2>&1 \
    || { cat "$venv/download.log" >&2; exit 1; }
echo "== the image's packages, as installed here"
"$venv/bin/python" -m pip list 2> /dev/null | grep -iE '^(torch|torch-geometric|numpy|pandas|scipy|pytest) '

status=0
echo "== the GPU check, small, with the image's Python"
PYTHON=$venv/bin/python GPU_CHECK_WHEELS=$wheels OUT=$venv/gpu_check bash benchmarks/gpu_check.sh --small "${stages[@]}" \
    || status=1

echo "== the GPU's tests stage's selection, collected with the wheels first on the path"
site=$(mktemp -d "${TMPDIR:-/tmp}/gpu_check_rehearsal.XXXXXX")
trap 'rm -rf "$site"' EXIT
"$venv/bin/python" -m pip install -q --no-index --no-deps --no-compile --target "$site" "$wheels"/*.whl
PYTHONPATH=$site:$PWD "$venv/bin/python" -m pytest -q -p no:cacheprovider --collect-only -k cuda \
    --ignore tests/test_gpu_check.py tests/ > "$site/collect.log" 2>&1 || status=1
tail -n 3 "$site/collect.log"
if grep -q "^ERROR" "$site/collect.log"; then
    grep -A 12 "^_* ERROR collecting" "$site/collect.log" || true
    status=1
fi
exit $status
