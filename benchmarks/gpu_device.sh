#!/usr/bin/env bash
# The GPU benchmarks of issue 21 §4 (gpu-mfu, gpu-varlen) on a lent GPU machine, from the working tree, in one call.
#
# The device image holds PyTorch, transformers, accelerate, tokenizers, typer, rich, pyarrow, ... but not
# `datasets` (nor its dill and multiprocess), and nothing can be fetched there. So, in two steps:
#
#   here, where pip reaches the registries:   bash benchmarks/gpu_device.sh wheels
#       the wheels of what the image lacks, at the versions installed here (the tested ones), for its
#       CPython 3.12, into .whl/ (ignored by git); pyarrow's too, used only if the image's is too old
#   there, with .whl carried:                  bash benchmarks/gpu_device.sh run [gpu-mfu options]
#       installs them into /tmp/site when `import datasets` fails, runs gpu-mfu then gpu-varlen, and leaves
#       BENCHMARKS.md (both sections rewritten) and each benchmark's log in $OUT (default: a new temp dir)
#
# With the device tool: run(command="bash benchmarks/gpu_device.sh run", carry=[".whl"], timeout_s=540), then
# copy $OUT's BENCHMARKS.md over this checkout's (or its two sections, if BENCHMARKS.md changed here since).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2

WHL=${PLM_WHEELS:-.whl}      # overridable for the tests
SITE=${PLM_WHEELS_SITE:-/tmp/site}
PY=${PYTHON:-python3}
MISSING=(datasets dill multiprocess) # not in the device image
FALLBACK=pyarrow                     # in the image, maybe older than datasets needs

die() { echo "gpu_device.sh: $*" >&2; exit 2; }

wheels() {
    mkdir -p "$WHL"
    local pkg ver
    for pkg in "${MISSING[@]}" "$FALLBACK"; do
        ver=$("$PY" -c "import importlib.metadata as m; print(m.version('$pkg'))" 2>/dev/null) ||
            die "$pkg is not installed here, so its tested version is unknown: pip install -e '.[test]' first"
        "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
            --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
            -d "$WHL" "$pkg==$ver" || die "could not download $pkg==$ver (pip needs the package registry)"
    done
    ls -l "$WHL"
}

install_missing() {
    "$PY" -c "import datasets" 2>/dev/null && return 0
    local base=() fallback=() f
    for f in "$WHL"/*.whl; do
        [ -e "$f" ] || die "datasets is not importable here and $WHL/ holds no wheels: run 'bash benchmarks/gpu_device.sh wheels' where pip works, and carry $WHL"
        case "$(basename "$f")" in
            "$FALLBACK"-*) fallback+=("$f") ;;
            *) base+=("$f") ;;
        esac
    done
    export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" "${base[@]}" ||
        die "installing ${base[*]} into $SITE failed"
    if ! "$PY" -c "import datasets" 2>/dev/null; then # the image's pyarrow is too old for this datasets
        [ ${#fallback[@]} -gt 0 ] || die "datasets still fails to import and $WHL/ holds no $FALLBACK wheel: $("$PY" -c 'import datasets' 2>&1 | tail -1)"
        "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" "${fallback[@]}" ||
            die "installing ${fallback[*]} into $SITE failed"
    fi
    "$PY" -c "import datasets" 2>/dev/null || die "datasets still fails to import: $("$PY" -c 'import datasets' 2>&1 | tail -1)"
}

run() {
    local out=${OUT:-$(mktemp -d)} rc=0
    mkdir -p "$out"
    install_missing
    export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
    nvidia-smi -L 2>/dev/null || echo "no nvidia-smi: both benchmarks will report no CUDA and skip"
    "$PY" -c "import torch, datasets, pyarrow, transformers, accelerate; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'datasets', datasets.__version__, 'pyarrow', pyarrow.__version__, 'transformers', transformers.__version__, 'accelerate', accelerate.__version__)"
    "$PY" -m benchmarks gpu-mfu "$@" 2>&1 | tee "$out/gpu-mfu.log" || rc=1
    "$PY" -m benchmarks gpu-varlen 2>&1 | tee "$out/gpu-varlen.log" || rc=1
    cp BENCHMARKS.md "$out/BENCHMARKS.md"
    echo "gpu_device.sh: logs and BENCHMARKS.md in $out"
    return $rc
}

case "${1:-}" in
    wheels) wheels ;;
    run) shift; run "$@" ;;
    *) die "usage: bash benchmarks/gpu_device.sh wheels | run [gpu-mfu options]" ;;
esac
