#!/usr/bin/env bash
# One GPU session of the timing benchmarks (benchmarks/timing.py --section gpu, ddp), sized to ~9 minutes.
#
# Runs on a bare GPU machine with its own Python (torch, JAX, numpy, scipy, matplotlib, tqdm, xarray)
# but without pyro-ppl / arviz: their wheels come along in .gpu/whl (see ../shared/notes/gpu.md), and
# a checkout of the JAX reference (tychovdo/noethers-razor) in .gpu/noethers-razor. Each part runs in
# its own process under its own time limit and writes its table to $OUT at once, so that a part which
# runs out of time loses only itself. Prepare here (git-ignored):
#
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#       -d .gpu/whl pyro-ppl==1.9.2 pyro-api arviz==0.23.4 h5netcdf xarray-einstats platformdirs
#   git --git-dir=<mirror of tychovdo/noethers-razor> archive HEAD | tar -x -C .gpu/noethers-razor
#   mkdir -p .gpu/fashion-mnist && cp /usr/share/datasets/fashion-mnist/*.gz .gpu/fashion-mnist/   # 30 MB
#
# then, on the device: OUT=<folder> bash benchmarks/gpu_session.sh  (PARTS="paper sho" runs only those parts;
# SECONDS_BUDGET=540 skips a part that would end after that many seconds of the script and shortens the
# last one, layerwise_paper, to what is left)
set -u
BUDGET=${SECONDS_BUDGET:-100000}
OUT=${OUT:-results/gpu_session}
mkdir -p "$OUT"
WORK=$(mktemp -d)  # tables and logs, packed into $OUT/all.tgz after every part (the device returns few files)
ROOT=$(pwd)
SITE=$(mktemp -d)
SRC=$(mktemp -d)
python3 -m pip install -q --no-index --no-deps --no-compile --target "$SITE" .gpu/whl/*.whl 2>&1 | tail -2
# the package as installed: pyro_invariance/models and pyro_invariance/guides from models/ and guides/
cp -r pyro_invariance "$SRC/" && cp -r models "$SRC/pyro_invariance/models" && cp -r guides "$SRC/pyro_invariance/guides"
export PYTHONPATH="$SITE:$SRC"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$OUT/gpu.txt" 2>&1
python3 -c "import torch, pyro, jax; print('torch', torch.__version__, 'pyro', pyro.__version__, 'jax', jax.__version__, jax.devices())" >> "$OUT/gpu.txt" 2>&1
export TORCHINDUCTOR_CACHE_DIR=$(mktemp -d)  # cold compile times, reported as such
B="python3 benchmarks/timing.py --section gpu --device cuda --out-dir $WORK"
REF="--reference-dir $ROOT/.gpu/noethers-razor"
part() {  # part <seconds> <stem> <args...>
  local secs=$1 stem=$2; shift 2
  case " ${PARTS:-$stem} " in *" $stem "*) ;; *) return 0 ;; esac  # PARTS="paper 3body": only those
  if (( SECONDS + secs > BUDGET )); then echo "$stem skipped: $secs s > $(( BUDGET - SECONDS )) s left" | tee -a "$OUT/parts.txt"; return 0; fi
  local t0=$(date +%s)
  timeout "$secs" $B --stem "gpu_step_time_cuda_$stem" "$@" > "$WORK/$stem.log" 2>&1
  echo "$stem rc=$? $(( $(date +%s) - t0 )) s" | tee -a "$OUT/parts.txt"
  tar czf "$OUT/all.tgz" -C "$WORK" .
}
# 1 process vs 2 ranks sharing the GPU (gloo; a simulated 2-rank run: same numbers, its overhead)
case " ${PARTS:-ddp} " in *" ddp "*)
  t0=$(date +%s)
  timeout 120 python3 benchmarks/timing.py --section ddp --quick --device cuda --backend gloo \
    --out-dir "$WORK" --stem ddp_throughput_cuda > "$WORK/ddp.log" 2>&1
  echo "ddp rc=$? $(( $(date +%s) - t0 )) s" | tee -a "$OUT/parts.txt"
  tar czf "$OUT/all.tgz" -C "$WORK" . ;;
esac
# the JAX reference in the background (REF_BACKGROUND=1): its start and end times go to parts.txt, so that
# the overlap with the torch parts is on record
REF_PID=
if [[ ${REF_BACKGROUND:-0} == 1 ]] && [[ " ${PARTS:-reference_sho} " == *" reference_sho "* ]]; then
  echo "reference_sho started at $SECONDS s (background)" | tee -a "$OUT/parts.txt"
  timeout ${REF_SECONDS:-420} $B --stem gpu_step_time_cuda_reference_sho --parts reference --reference-systems hnn-sho \
    $REF --warmup 1 --steps 4 > "$WORK/reference_sho.log" 2>&1 &
  REF_PID=$!
fi
wait_reference() {
  [[ -n $REF_PID ]] || return 0
  wait $REF_PID; echo "reference_sho rc=$? ended at $SECONDS s" | tee -a "$OUT/parts.txt"
  tar czf "$OUT/all.tgz" -C "$WORK" .
}
# the parts whose verdicts are open come first; the ones already met on 2026-11-26 (layer-wise) last
part 45 paper --parts mlp-paper --warmup 5 --steps 30 --compile-modes capture,cudagraphs
part 45 3body --parts hnn-3body --warmup 2 --steps 8 --compile-modes capture,cudagraphs
part 60 sho --parts hnn-sho --sho-particles 20,1 --warmup 1 --steps 3 --compile-modes cudagraphs
# the JAX reference compiled for longer than 120 s and 200 s before its first epoch on 2026-11-26. With
# REF_BACKGROUND=1 it starts first and compiles on the host CPUs while the torch parts run, its epochs
# timed after them (we wait for it), then 'sho_alone' measures ours again with the machine to itself.
if [[ ${REF_BACKGROUND:-0} == 1 ]]; then
  wait_reference; part 60 sho_alone --parts hnn-sho --sho-particles 20,1 --warmup 1 --steps 3 --compile-modes cudagraphs
else
  part ${REF_SECONDS:-200} reference_sho --parts reference --reference-systems hnn-sho $REF --warmup 1 --steps 4
fi
part 35 paper_tf32 --parts mlp-paper --tf32 --warmup 5 --steps 30 --compile-modes capture,cudagraphs
part 45 layerwise --parts layerwise --warmup 10 --steps 20 --layerwise-variants fit,fit-cudagraphs
# one paper-size (α = 10) epoch of F-FC+CONV with its KFAC-Laplace update, both tasks (the
# Fashion-MNIST .gz files travel in .gpu/fashion-mnist; results land in benchmarks/results, copied to $WORK)
case " ${PARTS:-layerwise_paper} " in *" layerwise_paper "*)
  if (( BUDGET - SECONDS < 60 )); then echo "layerwise_paper skipped: $(( BUDGET - SECONDS )) s left" | tee -a "$OUT/parts.txt"; else
  t0=$(date +%s)
  timeout $(( BUDGET - SECONDS < ${LAYERWISE_PAPER_SECONDS:-300} ? BUDGET - SECONDS : ${LAYERWISE_PAPER_SECONDS:-300} )) python3 benchmarks/layerwise_kfac.py --preset paper --epochs 1 \
    --base fashion-mnist --data-dir .gpu/fashion-mnist --variants f-fc+conv --methods "Laplace KFAC (gradient)" \
    --starts equivariant --seeds 0 --device cuda --stem layerwise_kfac_gpu > "$WORK/layerwise_paper.log" 2>&1
  echo "layerwise_paper rc=$? $(( $(date +%s) - t0 )) s" | tee -a "$OUT/parts.txt"
  cp benchmarks/results/layerwise_kfac_gpu* "$WORK/" 2>/dev/null
  tar czf "$OUT/all.tgz" -C "$WORK" .; fi ;;
esac
