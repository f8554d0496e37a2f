#!/usr/bin/env bash
# The GPU path, ready for a GPU machine: every solution notebook with COURSE_DEVICE=cuda (and the
# shipped course model unless COURSE_MODEL says otherwise), a table of pass/fail and times, <= 5 min.
#   tools/gpu_check.sh                          # on a machine with an NVIDIA GPU and `make install` done
#   COURSE_DEVICE=cpu tools/gpu_check.sh        # dry run of the same path on a CPU machine
#   GPU_CHECK_SECONDS=600 tools/gpu_check.sh solutions/01_*.ipynb   # more time, some lessons
set -euo pipefail
cd "$(dirname "$0")/.."
export COURSE_DEVICE="${COURSE_DEVICE:-cuda}" HF_HUB_OFFLINE="${HF_HUB_OFFLINE:-1}"
export HF_HUB_DISABLE_TELEMETRY=1 TOKENIZERS_PARALLELISM=false OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
PY="${PY:-.venv/bin/python}"
[ -x "$PY" ] || { echo "no $PY: run \`make install\` first (TORCH=cuda for a CUDA build)"; exit 1; }
if [ "$COURSE_DEVICE" = cuda ]; then
  nvidia-smi -L 2>/dev/null || { echo "COURSE_DEVICE=cuda but nvidia-smi finds no GPU: use COURSE_DEVICE=cpu for a dry run"; exit 1; }
  "$PY" -c "import torch; assert torch.cuda.is_available(), 'torch ' + torch.__version__ + \
' has no CUDA: reinstall it with \`make clean && make install TORCH=cuda\`'"
fi
# The table prints lesson by lesson, so a run cut at the limit still shows what it reached.
timeout "${GPU_CHECK_SECONDS:-300}" "$PY" -m tools.lesson_report "$@" \
  || echo "gpu_check: stopped at the ${GPU_CHECK_SECONDS:-300} s limit (rc $?)"
