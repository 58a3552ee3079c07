# Sourced by the *_device.sh scripts, from the repository root, on a lent GPU machine that has Python, torch and
# numpy but not this project's .venv (recipe: ../shared/notes/gpu.md): installs the missing packages from the wheels
# in .whl/ (git-ignored) into a fresh folder, copies the package with models/ and guides/ where its package-dir
# mapping puts them, and exports PYTHONPATH (and PYTHONUNBUFFERED, so logs arrive as they are written).
SITE=$(mktemp -d)
SRC=$(mktemp -d)
python3 -m pip install -q --no-index --no-deps --no-compile --target "$SITE" .whl/*.whl
cp -r pyro_invariance "$SRC/"
ln -s "$PWD/models" "$SRC/pyro_invariance/models"
ln -s "$PWD/guides" "$SRC/pyro_invariance/guides"
export PYTHONPATH="$SITE:$SRC" PYTHONUNBUFFERED=1
