#!/usr/bin/env bash
# The GPU checks and the GPU benchmarks, in one call on a lent GPU machine,
# from the working tree, in under 9 minutes on an H100.
#
# The device image holds PyTorch, transformers, accelerate, tokenizers, typer, rich, pyarrow, ... but not
# `datasets` (nor its dill and multiprocess), and nothing can be fetched there. So, in two steps:
#
#   here, where pip reaches the registries:   bash benchmarks/gpu/gpu_device.sh wheels
#       the wheels of what the image lacks, at the versions installed here (the tested ones), for its
#       CPython 3.12, into .whl/ (ignored by git); pyarrow's too, used only if the image's is too old
#   there, with .whl carried:                  bash benchmarks/gpu/gpu_device.sh run [gpu-mfu options]
#       installs them into /tmp/site when `import datasets` fails, then runs, each part its own process under
#       its own time cap, cheapest and most important first (a part that overruns loses its own figures only):
#         gpu-check --part syncs          host syncs per optimizer step (goal 0 on steps that do not log)
#         gpu-check --part fp16           fp16's loss_scale / nonfinite_steps columns, its loss beside bf16's
#         gpu-check --part workers        bert-mini tokens/s with train.num_workers=0 and auto
#         gpu-check --part resume         SIGTERM mid-run: exit 75, checkpoint, --resume, weights vs uninterrupted
#         gpu-check --part checkpointing  gpt2-small peak memory and tokens/s, activation checkpointing on / off
#         (then gpu-mfu, gpu-varlen and gpu-fsdp as the budget allows)
#         gpu-mfu                         BERT-base and GPT-2 small MFU (goal 45%), trimmed to 100 timed steps
#         gpu-varlen                      unpadded vs padded encoder steps
#       and leaves BENCHMARKS.md (each one's section rewritten, with the GPU, date and command) and each part's
#       log in $OUT (default: a new temp dir). The parts share one budget (PLM_GPU_BUDGET, default 510 s from
#       the start, install included): a part gets its cap or what is left, and is skipped under 20 s.
#       PLM_GPU_PARTS="gpu-mfu gpu-varlen" (log names) runs only those, e.g. to redo what a first call lost.
#
# With the device tool: run(command="bash benchmarks/gpu/gpu_device.sh run", carry=[".whl"], timeout_s=540), then
# copy $OUT's BENCHMARKS.md over this checkout's (or its gpu-* sections, if BENCHMARKS.md changed here since).
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2  # the repo root (this script is benchmarks/gpu/gpu_device.sh)

WHL=${PLM_WHEELS:-.whl}      # overridable for the tests
SITE=${PLM_WHEELS_SITE:-/tmp/site}
PY=${PYTHON:-python3}
MISSING=(datasets dill multiprocess) # not in the device image
FALLBACK=pyarrow                     # in the image, maybe older than datasets needs
# Under the device tool's 540 s, with room for its copying $OUT back; a part that would start later is skipped.
BUDGET=${PLM_GPU_BUDGET:-510}
ONLY=${PLM_GPU_PARTS:-}

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
        [ -e "$f" ] || die "datasets is not importable here and $WHL/ holds no wheels: run 'bash benchmarks/gpu/gpu_device.sh wheels' where pip works, and carry $WHL"
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

part() { # NAME CAP ARGS...: "$PY" ARGS, its output also in $out/NAME.log, stopped after CAP s or at the budget's end
    local name=$1 cap=$2 left status
    shift 2
    i=$((i + 1))
    [ -n "$ONLY" ] && [[ " $ONLY " != *" $name "* ]] && return
    left=$((BUDGET - SECONDS))
    ((cap > left)) && cap=$left
    if ((cap < 20)); then
        echo "gpu_device.sh: part $i/$N: $name skipped: ${left}s of the ${BUDGET}s budget left" | tee "$out/$name.log"
        rc=1
        return
    fi
    echo "gpu_device.sh: part $i/$N: $name (at most ${cap}s)"
    # timeout signals the part's whole process group: a SIGTERM stops plm's training at a step, with a checkpoint
    timeout --kill-after=10 "$cap" "$PY" "$@" 2>&1 | tee "$out/$name.log"
    status=${PIPESTATUS[0]}
    if ((status == 124 || status == 137)); then
        echo "gpu_device.sh: $name stopped at its ${cap}s cap; its figures are lost, the other parts go on" | tee -a "$out/$name.log"
        rc=1
    elif ((status != 0)); then
        echo "gpu_device.sh: $name failed (exit $status)" | tee -a "$out/$name.log"
        rc=1
    fi
}

run() {
    local out=${OUT:-$(mktemp -d)} rc=0 i=0 N=7
    mkdir -p "$out"
    install_missing
    export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
    nvidia-smi -L 2>/dev/null || echo "no nvidia-smi: every part will report no CUDA and skip"
    "$PY" -c "import torch, datasets, pyarrow, transformers, accelerate; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'datasets', datasets.__version__, 'pyarrow', pyarrow.__version__, 'transformers', transformers.__version__, 'accelerate', accelerate.__version__)"
    # Caps: what each part takes on an H100 (estimated), with room; gpu-mfu and gpu-varlen last, as the budget allows.
    part gpu-check-syncs 75 -m benchmarks gpu-check --part syncs
    part gpu-check-fp16 45 -m benchmarks gpu-check --part fp16
    part gpu-check-workers 55 -m benchmarks gpu-check --part workers
    part gpu-check-resume 75 -m benchmarks gpu-check --part resume
    part gpu-check-checkpointing 55 -m benchmarks gpu-check --part checkpointing
    # 100 timed steps after 20 (not 300 after 50): the MFU settles within a few dozen steps of 32k tokens.
    part gpu-mfu 140 -m benchmarks gpu-mfu --warmup 20 --steps 100 --log-every 10 --time-budget 45 "$@"
    part gpu-varlen 50 -m benchmarks gpu-varlen
    part gpu-fsdp 60 -m benchmarks.gpu.gpu_fsdp  # FSDP2 on one GPU: sharded save, resume, phase 2 (if time is left)
    cp BENCHMARKS.md "$out/BENCHMARKS.md"
    echo "gpu_device.sh: logs and BENCHMARKS.md in $out (${SECONDS}s)"
    return $rc
}

case "${1:-}" in
    wheels) wheels ;;
    run) shift; run "$@" ;;
    *) die "usage: bash benchmarks/gpu/gpu_device.sh wheels | run [gpu-mfu options]" ;;
esac
