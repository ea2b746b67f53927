#!/usr/bin/env bash
# GPU checks, for a machine with a CUDA GPU (under 8 minutes on one H200): every gpu-marked test (node
# classification: single process on the GPU, pipeline / graph parallelism / hybrid with every rank on the one GPU
# over gloo; the ASE calculator on the GPU equal to the CPU; S2EF: float64 on the GPU equal to the CPU step for step,
# G2 / S2 / D2 / S2xG2 on the one GPU equal to the single-GPU run, --amp, checkpoints across devices, the memory
# model within 15 % of every rank's peak), then one GCNII-32 epoch on the GPU beside PyG's GCN2Conv stack and the
# S2EF GPU benchmarks (benchmarks/bench_s2ef_gpu.py: our DimeNet++ step against PyG's in float32 and --amp,
# GemNet-dT steps per second and data wait, the largest batch that trains against the memory model's, the memory
# model per rank). Each part has its own time limit; a part that fails or runs out of time does not stop the
# others, and the script exits non-zero if any did. The benchmark's lines are also written to
# $GPU_CHECK_OUT/bench_s2ef_gpu.json (default: $OUT when set, else gpu_check_out/), kept up to date line by line.
#
#   bash benchmarks/gpu_check.sh            # from the repository root
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
DEST=${GPU_CHECK_OUT:-${OUT:-gpu_check_out}}
mkdir -p "$DEST"
"$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'no CUDA GPU here')" || exit 2
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || true
failed=()
run() {  # run LABEL SECONDS COMMAND...: the command under a time limit, its status remembered
    local label=$1 limit=$2
    shift 2
    local t0=$SECONDS
    timeout --kill-after=10 "$limit" "$@"
    local rc=$?
    echo "## $label: exit $rc after $((SECONDS - t0)) s (limit $limit s)"
    [ "$rc" -eq 0 ] || failed+=("$label (exit $rc)")
}
run "gpu-marked tests" 210 "$PY" -m pytest -q -m gpu -p no:cacheprovider --durations=0 \
    tests/core/test_gpu.py tests/tasks/s2ef/test_calculator.py tests/tasks/s2ef/test_gpu.py
run "GCNII vs PyG" 35 "$PY" benchmarks/bench_gcnii_vs_pyg.py --device cuda --epochs 5
run "S2EF GPU benchmarks" 215 "$PY" benchmarks/bench_s2ef_gpu.py --device cuda --part-s 40 --largest-s 70 \
    --json "$DEST/bench_s2ef_gpu.json"
if [ ${#failed[@]} -gt 0 ]; then
    printf 'FAILED: %s\n' "${failed[@]}"
    exit 1
fi
echo "all GPU checks passed"
