#!/usr/bin/env bash
# HyperPod lifecycle step for the GPU (worker) nodes: install and start the gpufleet publisher.
#   install_gpufleet_worker.sh [--bundle DIR] [--root DIR] [--resource-config FILE] [--strict]
# Call it from your on_create.sh / lifecycle_script.py on the worker instance groups, as root.
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
BUNDLE="$HERE/gpufleet"
ROOT=""
RESOURCE_CONFIG="/opt/ml/config/resource_config.json"
STRICT=0
DEPS=1
usage() {
  cat <<'USAGE'
Usage: install_gpufleet_worker.sh [--bundle DIR] [--root DIR] [--resource-config FILE] [--strict]

Installs the gpufleet publisher on a SageMaker HyperPod worker node, offline: everything comes from the
bundle staged in S3 next to the lifecycle scripts (HyperPod copies the whole LifeCycleConfig.SourceS3Uri
folder onto the node before it runs them). The bundle (make it with stage_bundle.sh) holds:
  gpufleet/ami/...            install.sh, the systemd units, publisher.json
  gpufleet/layers/node/...    the gpufleet_node package and requirements.txt
  gpufleet/wheels/            pip wheels for the node's Python (boto3, nvidia-ml-py, ...)
Python: the first of python3.12, python3.11, python3.10, python3.9, python3 that is >= 3.9 (the node
layer's floor); none: one line, and exit 0 (a monitoring gap must not fail the node's provisioning)
unless --strict.
The node's group is its HyperPod cluster and instance group, read from HyperPod's resource file: it is
copied, readable by the publisher's user, to /var/lib/gpufleet/resource_config.json (the original may be
root's only) and named in /etc/gpufleet/publisher.json (hyperpod_resource_config).
Slurm's binaries (/opt/slurm/bin on HyperPod) go on the publisher's PATH: its squeue gives each job's
account and partition for the usage records.

  --bundle DIR           the staged bundle (default: ./gpufleet next to this script)
  --root DIR             install under DIR instead of / (tests: no user, no systemctl)
  --resource-config FILE HyperPod's resource file (default /opt/ml/config/resource_config.json)
  --strict               fail (exit 1) when no Python >= 3.9 is found
  --no-deps              do not pip-install the wheels (tests)
  -h, --help             this text
USAGE
}
while [[ $# -gt 0 ]]; do
  case "$1" in
    -h|--help) usage; exit 0 ;;
    --bundle) BUNDLE="$2"; shift 2 ;;
    --root) ROOT="${2%/}"; shift 2 ;;
    --resource-config) RESOURCE_CONFIG="$2"; shift 2 ;;
    --strict) STRICT=1; shift ;;
    --no-deps) DEPS=0; shift ;;
    *) echo "install_gpufleet_worker.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done

PY=""
for candidate in python3.12 python3.11 python3.10 python3.9 python3; do
  path="$(command -v "$candidate" || true)"
  if [[ -n "$path" ]] && "$path" -c 'import sys; sys.exit(sys.version_info < (3, 9))' 2>/dev/null; then
    PY="$path"
    break
  fi
done
if [[ -z "$PY" ]]; then
  echo "gpufleet: no Python >= 3.9 on this node: publisher not installed" >&2
  exit "$STRICT"
fi
for need in "$BUNDLE/ami/install.sh" "$BUNDLE/layers/node/gpufleet_node"; do
  [[ -e "$need" ]] || { echo "gpufleet: bundle incomplete: $need missing (see stage_bundle.sh)" >&2; exit 1; }
done

LIB="$ROOT/opt/gpufleet/lib"
install -d -m 0755 "$LIB"
if [[ "$DEPS" == 1 ]]; then  # offline: only the staged wheels, never an index (no internet needed)
  "$PY" -m pip install --quiet --no-compile --no-index --find-links "$BUNDLE/wheels" --target "$LIB" \
    -r "$BUNDLE/layers/node/requirements.txt" boto3
fi
bash "$BUNDLE/ami/install.sh" --root "${ROOT:-/}" --source "$BUNDLE/layers/node" --no-deps

STATE="$ROOT/var/lib/gpufleet"
install -d -m 0755 "$STATE"
if [[ -r "$RESOURCE_CONFIG" ]]; then
  install -m 0644 "$RESOURCE_CONFIG" "$STATE/resource_config.json"
else
  echo "gpufleet: $RESOURCE_CONFIG not readable: the node will read its group from instance tags" >&2
fi
"$PY" - "$ROOT/etc/gpufleet/publisher.json" <<'PYCONF'
import json, sys
path = sys.argv[1]
with open(path) as f:
    doc = json.load(f)
doc["hyperpod_resource_config"] = "/var/lib/gpufleet/resource_config.json"
with open(path, "w") as f:
    json.dump(doc, f, indent=2)
    f.write("\n")
PYCONF

DROPIN="$ROOT/etc/systemd/system/gpufleet-publisher.service.d"
install -d -m 0755 "$DROPIN"
cat > "$DROPIN/hyperpod.conf" <<UNIT
# Written by install_gpufleet_worker.sh: the Python it found, and Slurm's binaries on PATH (squeue).
[Service]
ExecStart=
ExecStart=$PY -m gpufleet_node --config /etc/gpufleet/publisher.json
Environment=PATH=/opt/slurm/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
UNIT

if [[ -z "$ROOT" ]]; then
  chown -R gpufleet:gpufleet /var/lib/gpufleet
  systemctl daemon-reload
  systemctl restart gpufleet-publisher.service
fi
echo "gpufleet publisher installed for HyperPod into ${ROOT:-/} (python: $PY)"
