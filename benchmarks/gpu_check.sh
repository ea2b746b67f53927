#!/usr/bin/env bash
# GPU checks, for a machine with a CUDA GPU (under 5 minutes): the gpu-marked tests (single process
# on the GPU, pipeline / graph parallelism / hybrid with every rank on the one GPU over gloo, C = 1 pipeline
# equal to the CPU single process within 1e-4, the ASE calculator on the GPU equal to the CPU), then one GCNII-32
# epoch on the GPU beside PyG's GCN2Conv stack.
#
#   bash benchmarks/gpu_check.sh            # from the repository root
set -euo pipefail
cd "$(dirname "$0")/.."
python -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'no CUDA GPU here')"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || true
timeout 300 python -m pytest -q -m gpu tests/core/test_gpu.py tests/tasks/s2ef/test_calculator.py -p no:cacheprovider
timeout 120 python benchmarks/bench_gcnii_vs_pyg.py --device cuda --epochs 5
