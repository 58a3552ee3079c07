#!/usr/bin/env bash
# One GPU session of the speed comparisons (benchmarks/timing.py --section gpu), sized to at most 10 minutes
# on one H100 from a fresh machine (SECONDS_BUDGET, default 570 s of this script), writing one result folder,
# $OUT/results (also packed into $OUT/all.tgz after every part), and its speed table, $OUT/results/speed_table.md.
#
# Runs on a bare GPU machine with its own Python (torch, JAX, numpy, scipy, matplotlib, tqdm, xarray)
# but without pyro-ppl / arviz: their wheels come along in .gpu/whl (see ../shared/notes/gpu.md), and
# a checkout of the JAX reference (tychovdo/noethers-razor) in .gpu/noethers-razor. Each part runs in
# its own process under its own time limit and writes its table at once, so that a part which runs out
# of time loses only itself. Prepare here (keep .gpu/ out of git):
#
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#       -d .gpu/whl pyro-ppl==1.9.2 pyro-api arviz==0.23.4 h5netcdf xarray-einstats platformdirs
#   mkdir -p .gpu/noethers-razor && git --git-dir=<mirror of tychovdo/noethers-razor> archive HEAD | tar -x -C .gpu/noethers-razor
#   mkdir -p .gpu/fashion-mnist && cp /usr/share/datasets/fashion-mnist/*.gz .gpu/fashion-mnist/   # 30 MB
#
# then, on the device: OUT=<folder> bash benchmarks/gpu_session.sh
#
# Order: the JAX reference's steps (benchmarks/reference_step.py through timing.py --parts reference) compile
# first in the background while the invariant-MLP and layer-wise parts run (each part records its interval,
# so the overlap is in the tables); then the reference's steps are timed alone, then the HNN parts that are
# compared with it; torch.compile last (cold compiles, the likeliest to run out of time); then the table.
# PARTS="overhead paper" runs only those parts; extra parts, not in the default: ddp, paper_tf32,
# layerwise_paper (one paper-size epoch of the layer-wise KFAC benchmark).
set -u
BUDGET=${SECONDS_BUDGET:-570}
DEFAULT_PARTS="reference overhead paper layerwise sho 3body inductor"
OUT=${OUT:-results/gpu_session}
RES="$OUT/results"
mkdir -p "$RES"
ROOT=$(pwd)
SITE=$(mktemp -d)
SRC=$(mktemp -d)
python3 -m pip install -q --no-index --no-deps --no-compile --target "$SITE" .gpu/whl/*.whl 2>&1 | tail -2
# the package as installed: pyro_invariance/models and pyro_invariance/guides from models/ and guides/
cp -r pyro_invariance "$SRC/" && cp -r models "$SRC/pyro_invariance/models" && cp -r guides "$SRC/pyro_invariance/guides"
export PYTHONPATH="$SITE:$SRC"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$RES/gpu.txt" 2>&1
python3 -c "import torch, pyro, jax; print('torch', torch.__version__, 'pyro', pyro.__version__, 'jax', jax.__version__, jax.devices())" >> "$RES/gpu.txt" 2>&1
export TORCHINDUCTOR_CACHE_DIR=$(mktemp -d)  # cold compile times, reported as such
B="python3 benchmarks/timing.py --section gpu --device cuda --out-dir $RES"
wanted() { case " ${PARTS:-$DEFAULT_PARTS} " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }
pack() { tar czf "$OUT/all.tgz" -C "$RES" .; }
part() {  # part <seconds> <stem> <args...>
  local secs=$1 stem=$2; shift 2
  wanted "$stem" || return 0
  if (( SECONDS + secs > BUDGET )); then echo "$stem skipped: $secs s > $(( BUDGET - SECONDS )) s left" | tee -a "$RES/parts.txt"; return 0; fi
  local t0=$SECONDS
  timeout "$secs" $B --stem "gpu_step_time_cuda_$stem" "$@" > "$RES/$stem.log" 2>&1
  echo "$stem rc=$? $(( SECONDS - t0 )) s (from $t0 s)" | tee -a "$RES/parts.txt"
  pack
}
# the JAX reference compiles in the background while the torch parts run, then waits for reference.go before
# its steps, which run alone on the GPU (JAX cannot cache a step with host callbacks, so it is one process)
REF_PID=
if wanted reference; then
  echo "reference started at $SECONDS s (background: compiles, then waits)" | tee -a "$RES/parts.txt"
  timeout "${REF_SECONDS:-400}" $B --stem gpu_step_time_cuda_reference --parts reference \
    --reference-systems hnn-sho,hnn-3body --reference-dir "$ROOT/.gpu/noethers-razor" \
    --reference-go "$RES/reference.go" > "$RES/reference.log" 2>&1 &
  REF_PID=$!
fi
MODES="--compile-modes capture,cudagraphs"
part 60 overhead --parts mlp-overhead $MODES
part 80 paper --parts mlp-paper $MODES
part 100 layerwise --parts layerwise --layerwise-variants fit,fit-laplace,fit-cudagraphs
if [[ -n $REF_PID ]]; then
  echo "reference steps released at $SECONDS s" | tee -a "$RES/parts.txt"; touch "$RES/reference.go"
  wait "$REF_PID"; echo "reference rc=$? ended at $SECONDS s" | tee -a "$RES/parts.txt"; rm -f "$RES/reference.go"; pack
fi
part 80 sho --parts hnn-sho --compile-modes cudagraphs
part 90 3body --parts hnn-3body --compile-modes cudagraphs
part 150 inductor --parts mlp-overhead,mlp-paper --compile-modes inductor --skip-default
part 60 paper_tf32 --parts mlp-paper --tf32 $MODES
if wanted ddp; then  # 1 process vs 2 ranks sharing the GPU (gloo; a simulated 2-rank run: its overhead)
  timeout 120 python3 benchmarks/timing.py --section ddp --quick --device cuda --backend gloo \
    --out-dir "$RES" --stem ddp_throughput_cuda > "$RES/ddp.log" 2>&1
  echo "ddp rc=$?" | tee -a "$RES/parts.txt"; pack
fi
# one paper-size (α = 10) epoch of F-FC+CONV with its KFAC-Laplace update, both tasks (the
# Fashion-MNIST .gz files travel in .gpu/fashion-mnist; results land in benchmarks/results, copied to $RES)
if wanted layerwise_paper; then
  if (( BUDGET - SECONDS < 60 )); then echo "layerwise_paper skipped: $(( BUDGET - SECONDS )) s left" | tee -a "$RES/parts.txt"; else
  t0=$SECONDS
  LEFT=$(( BUDGET - SECONDS < ${LAYERWISE_PAPER_SECONDS:-300} ? BUDGET - SECONDS : ${LAYERWISE_PAPER_SECONDS:-300} ))
  timeout "$LEFT" python3 benchmarks/layerwise_kfac.py --preset paper --epochs 1 \
    --base fashion-mnist --data-dir .gpu/fashion-mnist --variants f-fc+conv --methods "Laplace KFAC (gradient)" \
    --starts equivariant --seeds 0 --device cuda --stem layerwise_kfac_gpu > "$RES/layerwise_paper.log" 2>&1
  echo "layerwise_paper rc=$? $(( SECONDS - t0 )) s" | tee -a "$RES/parts.txt"
  cp benchmarks/results/layerwise_kfac_gpu* "$RES/" 2>/dev/null; pack; fi
fi
# the speed table of README and docs/speed.md, from this folder's result files only
python3 benchmarks/timing.py --section gpu --render-speed "$RES" --out-dir "$RES" > "$RES/render.log" 2>&1
echo "speed table rc=$? at $SECONDS s" | tee -a "$RES/parts.txt"
pack
