#!/usr/bin/env bash
# The GPU phases of issue 15 on a lent GPU machine that has Python, torch, numpy and scikit-learn but not this
# project's .venv (recipe: ../shared/notes/gpu.md; wheels in .whl/, git-ignored, as in
# uncertain_symmetry_iwae_device.sh), within LIMIT seconds:
#   1. uncertain_symmetry_warmup.py --refine --device cuda (module docstring f) of the two units registered for it
#      and not yet run (rbf upright seed 1, linear upright seed 0), evaluated on the CPU there;
#   2. uncertain_symmetry_collapsed.py --streams --device cuda (module docstring g) of every fitted state,
#      upright first, JOBS processes at a time; then of the two new refinements.
# The fitted states (git-ignored) travel with `carry`: .whl and research/uncertain_symmetry/results/uncertain_symmetry_warmup_units/states.
# Everything new comes back as one archive, $OUT/results.tar (unpack it at the repository root); logs beside it.
# Usage, from the repository root: LIMIT=500 JOBS=2 bash research/uncertain_symmetry/scripts/uncertain_symmetry_collapsed_device.sh
# (REFINE= to skip step 1). Measured on an H100: one process of step 2 peaks near 30 GB (2000 particles a pass),
# so JOBS=4 runs out of memory; a refinement takes under 100 s.
set -u
LIMIT=${LIMIT:-500}
JOBS=${JOBS:-2}
DEVICE=${DEVICE:-cuda}
REFINE=${REFINE-rbf_upright_seed1,linear_upright_seed0}
W=research/uncertain_symmetry/results/uncertain_symmetry_warmup_units
C=research/uncertain_symmetry/results/uncertain_symmetry_collapsed_units
FROM=research/uncertain_symmetry/results/uncertain_symmetry_symmetry-conditional_steps4000.json
REF=research/uncertain_symmetry/results/uncertain_symmetry_refined_units
START=$SECONDS
. research/uncertain_symmetry/scripts/device_env.sh
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
(cd / && python3 -c "import torch, pyro, sklearn, pyro_invariance; print('torch', torch.__version__, 'pyro', pyro.__version__, 'cuda', torch.cuda.is_available())") || exit 1
(while sleep 30; do echo "gpu at $((SECONDS - START)) s: $(nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader)"; done) &
MON=$!
left() { echo $((LIMIT - (SECONDS - START))); }
# 1. the refinements, one process each
PIDS=""
for u in ${REFINE//,/ }; do
  timeout "$(left)" python3 research/uncertain_symmetry/scripts/uncertain_symmetry_warmup.py --from "$FROM" --reference "$REF" --work-dir "$W" \
    --refine --device "$DEVICE" --only "$u" --threads 2 > "$OUT/refine_$u.log" 2>&1 &
  PIDS="$PIDS $!"
done
# 2. (g): the states there now, upright first, dealt round-robin to JOBS processes
STEMS=$(ls "$W/states" | sed 's/\.pt$//' | grep -v _refined$ | awk -F_ '{o = ($2 == "upright") ? 0 : ($2 == "partially-rotated") ? 1 : 2; print o, $3, $0}' | sort | cut -d' ' -f3)
STEMS="$(ls "$W/states" | sed 's/\.pt$//' | grep _refined$) $STEMS"
SPIDS=""
for j in $(seq 0 $((JOBS - 1))); do
  ONLY=$(echo $STEMS | tr ' ' '\n' | awk -v j="$j" -v n="$JOBS" '(NR - 1) % n == j' | paste -sd,)
  timeout "$(left)" python3 research/uncertain_symmetry/scripts/uncertain_symmetry_collapsed.py --from "$FROM" --reference "$REF" --work-dir "$C" \
    --states "$W" --streams --device "$DEVICE" --only "$ONLY" --threads 2 > "$OUT/streams_$j.log" 2>&1 &
  SPIDS="$SPIDS $!"
done
[ -n "$PIDS" ] && wait $PIDS
NEW=$(for u in ${REFINE//,/ }; do [ -f "$W/states/${u}_refined.pt" ] && echo "${u}_refined"; done | paste -sd,)
if [ -n "$NEW" ] && [ "$(left)" -gt 30 ]; then
  timeout "$(left)" python3 research/uncertain_symmetry/scripts/uncertain_symmetry_collapsed.py --from "$FROM" --reference "$REF" --work-dir "$C" \
    --states "$W" --streams --device "$DEVICE" --only "$NEW" --threads 2 > "$OUT/streams_refined.log" 2>&1
fi
[ -n "$SPIDS" ] && wait $SPIDS
kill $MON
echo "done at $((SECONDS - START)) s: $(ls $C/collapsed/*_streams.json 2>/dev/null | wc -l) stream units"
tar -cf "$OUT/results.tar" $(ls $C/collapsed/*_streams.json 2>/dev/null) \
  $(for u in ${REFINE//,/ }; do ls $W/evaluated/${u}_refined.json $W/states/${u}_refined.pt 2>/dev/null; done)
