#!/bin/bash
# One prepared device check (docs/scale.md): the CUDA path of `seeupo train` on a GPU machine that has
# torch/transformers/peft/accelerate but not our other dependencies (carried as wheels in .whl) and no
# model weights (tiny models only; the tokenizer travels in .devcache). Optional: a CPU sweep of
# tiny-preset overrides over the machine's cores (SWEEP_FILE: one override list per line).
#
# Prepare here (ignored by git through .git/info/exclude):
#   pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#       --platform manylinux2014_x86_64 -d .whl pydantic pydantic-core annotated-types typing-inspection gguf
#   mkdir -p .devcache/models/smollm2-135m-instruct && cp ~/.cache/seeupo/models/smollm2-135m-instruct/*.j* \
#       .devcache/models/smollm2-135m-instruct/ && : > .devcache/models/smollm2-135m-instruct/model.safetensors
# (the empty weights file stops a conversion: tiny models need only the tokenizer), then run this
# script there with .whl and .devcache carried.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD SEEUPO_CACHE=$PWD/.devcache PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT" /tmp/r
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import torch, transformers, peft, accelerate; print('torch', torch.__version__, 'transformers', transformers.__version__, 'peft', peft.__version__, 'accelerate', accelerate.__version__, 'cuda', torch.cuda.is_available())"
summ() {  # one line from a run folder's summary.json
  python3 -c "import json,sys; d=json.load(open(sys.argv[1]+'/summary.json')); print(sys.argv[2], 'avg@k %.3f -> %.3f' % (d['eval_before']['avg@k'], d['eval_after']['avg@k']), 'wall %.1f s' % d['wall_seconds'], 'l2 %.6f' % d['trainable_param_l2'])" "$1" "$2" 2>&1 | tail -1
}
if [ -z "${SKIP_GPU:-}" ]; then
  for a in seeupo grpo ppo; do
    python3 -m seeupo train --preset tiny --algo $a --steps 2 --seed 2 --out /tmp/r/cuda_$a run.device=cuda 'run.loggers=[jsonl]' > /tmp/r/cuda_$a.log 2>&1 || tail -20 /tmp/r/cuda_$a.log
    summ /tmp/r/cuda_$a "cuda $a 2 steps:"
  done
  python3 -m seeupo train --preset tiny --steps 2 --seed 2 --out /tmp/r/cpu_seeupo run.device=cpu 'run.loggers=[jsonl]' > /tmp/r/cpu.log 2>&1 || tail -20 /tmp/r/cpu.log
  summ /tmp/r/cpu_seeupo "cpu  seeupo 2 steps:"
  python3 -m seeupo train --preset tiny --steps 2 --seed 2 --out /tmp/r/cuda_lora run.device=cuda model.lora=true 'run.loggers=[jsonl]' > /tmp/r/lora.log 2>&1 || tail -20 /tmp/r/lora.log
  summ /tmp/r/cuda_lora "cuda seeupo+LoRA 2 steps:"
  torchrun --standalone --nproc_per_node 1 -m seeupo train --preset tiny --steps 2 --seed 2 --out /tmp/r/tr1 run.device=cuda 'run.loggers=[jsonl]' > /tmp/r/tr1.log 2>&1 || tail -20 /tmp/r/tr1.log
  summ /tmp/r/tr1 "torchrun x1 cuda (nccl) seeupo 2 steps:"
  for lora in false true; do
    torchrun --standalone --nproc_per_node 1 -m seeupo train --preset tiny --steps 2 --seed 2 --out /tmp/r/fsdp_$lora run.device=cuda parallel.strategy=fsdp2 model.lora=$lora 'run.loggers=[jsonl]' > /tmp/r/fsdp_$lora.log 2>&1 || tail -20 /tmp/r/fsdp_$lora.log
    summ /tmp/r/fsdp_$lora "torchrun x1 cuda fsdp2 lora=$lora seeupo 2 steps:"
  done
  [ -n "${SKIP_FULL:-}" ] || python3 -m seeupo train --preset tiny --seed 0 --out /tmp/r/cuda_full run.device=cuda 'run.loggers=[jsonl]' > /tmp/r/full.log 2>&1 || tail -20 /tmp/r/full.log
  [ -n "${SKIP_FULL:-}" ] || summ /tmp/r/cuda_full "cuda tiny preset seed 0 (40 iterations):"
  cp /tmp/r/cuda_seeupo/metrics.jsonl "$OUT/cuda_seeupo_metrics.jsonl" 2>/dev/null
fi
if [ -n "${SWEEP_FILE:-}" ]; then
  export OMP_NUM_THREADS=2
  i=0
  while read -r line; do
    [ -z "$line" ] && continue
    i=$((i+1))
    for s in 0 1 2; do echo "$i $s $line"; done
  done < "$SWEEP_FILE" > /tmp/r/jobs
  run_one() {
    set -- $1; i=$1; s=$2; shift 2
    python3 -m seeupo train --preset tiny --seed $s --out /tmp/r/sw_${i}_$s "$@" 'run.loggers=[jsonl]' > /tmp/r/sw_${i}_$s.log 2>&1
    summ /tmp/r/sw_${i}_$s "sweep $i seed $s [$*]"
  }
  export -f run_one summ
  xargs -P "${JOBS:-7}" -I{} bash -c 'run_one "$@"' _ {} < /tmp/r/jobs | tee "$OUT/sweep.txt"
fi
