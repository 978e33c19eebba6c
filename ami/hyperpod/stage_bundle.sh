#!/usr/bin/env bash
# Build the offline bundle the HyperPod lifecycle scripts install from, then copy it to S3 next to them.
#   stage_bundle.sh OUT_DIR [--python-version 3.10] [--platform manylinux2014_x86_64]
# Needs network (PyPI) once, here; the nodes need none. Upload: aws s3 sync OUT_DIR s3://BUCKET/PREFIX/
set -euo pipefail
[[ $# -ge 1 && "$1" != -* ]] || { echo "usage: stage_bundle.sh OUT_DIR [--python-version X.Y] [--platform P]" >&2; exit 2; }
OUT="$1"; shift
PYVER="3.10"  # match the nodes' python3 (check: `python3 --version` on a HyperPod node)
PLATFORM="manylinux2014_x86_64"
while [[ $# -gt 0 ]]; do
  case "$1" in
    --python-version) PYVER="$2"; shift 2 ;;
    --platform) PLATFORM="$2"; shift 2 ;;
    *) echo "stage_bundle.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
REPO="$(cd "$(dirname "$0")/../.." && pwd)"
B="$OUT/gpufleet"
rm -rf "$B"
install -d "$B/ami" "$B/layers/node" "$B/wheels"
cp "$REPO"/ami/install.sh "$REPO"/ami/*.service "$REPO"/ami/*.path "$REPO"/ami/publisher.json \
  "$REPO"/ami/slurm_pending_gpus.py "$B/ami/" 2>/dev/null || true
cp -r "$REPO/layers/node/gpufleet_node" "$REPO/layers/node/requirements.txt" "$B/layers/node/"
find "$B" -name '__pycache__' -prune -exec rm -rf {} +
python3 -m pip download --quiet --dest "$B/wheels" --only-binary=:all: --python-version "$PYVER" \
  --platform "$PLATFORM" -r "$REPO/layers/node/requirements.txt" boto3
cp "$REPO"/ami/hyperpod/install_gpufleet_*.sh "$OUT/"
echo "bundle in $OUT: upload it next to your lifecycle scripts (aws s3 sync $OUT s3://BUCKET/PREFIX/)"
