#!/usr/bin/env bash
# The refinement phase of uncertain_symmetry_iwae.py (--refine, module docstring b) on a lent GPU machine
# that has Python, torch and numpy but not this project's .venv (recipe: ../shared/notes/gpu.md): the
# missing packages from wheels in .whl/ (git-ignored; `python3 -m pip download --no-deps --only-binary=:all:
# --python-version 3.12 --implementation cp -d .whl pyro-ppl==1.9.2 pyro-api arviz==0.23.4 h5netcdf
# xarray-einstats platformdirs`), then every prepared unit refined on the GPU, JOBS processes at a time.
# The refined states come back as one archive, $OUT/refined.tar (the device tool returns few files);
# UNITS (a grep pattern, default all) picks the units. Unpack it into the work dir's refined/ here.
# Usage, from the repository root: JOBS=9 LIMIT=480 bash research/uncertain_symmetry/scripts/uncertain_symmetry_iwae_device.sh
set -u
W=research/uncertain_symmetry/results/uncertain_symmetry_iwae_units
JOBS=${JOBS:-9}
LIMIT=${LIMIT:-480}
DEVICE=${DEVICE:-cuda}
UNITS=${UNITS:-.}
. research/uncertain_symmetry/scripts/device_env.sh
WORK=$(mktemp -d)
ln -s "$PWD/$W/prepared" "$WORK/prepared"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
(cd / && python3 -c "import torch, pyro, pyro_invariance; print('torch', torch.__version__, 'pyro', pyro.__version__, 'cuda', torch.cuda.is_available())")
(while sleep 30; do echo "gpu: $(nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader)"; done) &
MON=$!
# upright and ±90° first (where the ELBO fits missed the reference), fully rotated last
P=$(ls "$W/prepared" | sed 's/\.pt$//' | grep -E "$UNITS")
{ echo "$P" | grep _upright_; echo "$P" | grep _partially-rotated_; echo "$P" | grep _rotated_; } | timeout "$LIMIT" xargs -P "$JOBS" -I{} python3 research/uncertain_symmetry/scripts/uncertain_symmetry_iwae.py \
  --from research/uncertain_symmetry/results/uncertain_symmetry_steps4000.json research/uncertain_symmetry/results/uncertain_symmetry_symmetry-conditional_steps4000.json \
  --names mean-field,symmetry-conditional --reference research/uncertain_symmetry/results/uncertain_symmetry_refined_units \
  --work-dir "$WORK" --refine --device "$DEVICE" --only {}
kill $MON
echo "refined: $(ls "$WORK/refined" | wc -l) of $(echo "$P" | wc -l)"
tar -cf "$OUT/refined.tar" -C "$WORK" refined
nvidia-smi --query-gpu=memory.used --format=csv,noheader
