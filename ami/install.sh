#!/usr/bin/env bash
# Install the gpufleet publisher (layers/node) into an AMI, or into --root DIR for tests.
#   install.sh [--root DIR] [--source DIR] [--no-deps]
# --source: the node layer's content (default: ../layers/node next to this script)
# --no-deps: do not pip-install boto3 / nvidia-ml-py (tests; an AMI build needs them)
set -euo pipefail

ROOT=/
SOURCE="$(cd "$(dirname "$0")/.." && pwd)/layers/node"
DEPS=1
HERE="$(cd "$(dirname "$0")" && pwd)"
usage() {
  cat <<'USAGE'
Usage: install.sh [--root DIR] [--source DIR] [--no-deps]

Installs the gpufleet GPU publisher: the Python package into /opt/gpufleet/lib, its systemd unit
(gpufleet-publisher.service, enabled), /etc/gpufleet/publisher.json (kept if it exists), a
'gpufleet' system user in the 'video' group, gpufleet-podresources-access.path (enabled: after each
kubelet start, an ACL entry lets that user connect to the kubelet's PodResources socket), and /usr/local/bin/gpufleet-node (`gpufleet-node busy --
COMMAND` keeps the node from scale-in while a queue worker's job runs; /etc/tmpfiles.d/gpufleet-busy.conf). Run as root in an AMI build (Packer: ami/*.pkr.hcl) on an
NVIDIA GPU base image with python3 >= 3.9 and pip; it needs network access to PyPI for its two
dependencies (boto3, nvidia-ml-py).

  --root DIR    install under DIR instead of / (tests; no user, no systemctl)
  --source DIR  the node layer's content (default: ../layers/node next to this script)
  --no-deps     do not pip-install boto3 / nvidia-ml-py (tests; an AMI build needs them)
  -h, --help    this text
USAGE
}
while [[ $# -gt 0 ]]; do
  case "$1" in
    -h|--help) usage; exit 0 ;;
    --root) ROOT="$2"; shift 2 ;;
    --source) SOURCE="$2"; shift 2 ;;
    --no-deps) DEPS=0; shift ;;
    *) echo "install.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
ROOT="${ROOT%/}"

LIB="$ROOT/opt/gpufleet/lib"
install -d -m 0755 "$LIB" "$ROOT/etc/gpufleet" "$ROOT/etc/systemd/system" "$ROOT/var/lib/gpufleet"
rm -rf "$LIB/gpufleet_node"
cp -r "$SOURCE/gpufleet_node" "$LIB/gpufleet_node"
find "$LIB/gpufleet_node" -name '__pycache__' -prune -exec rm -rf {} +
if [[ "$DEPS" == 1 ]]; then
  python3 -m pip install --quiet --no-compile --target "$LIB" -r "$SOURCE/requirements.txt" boto3
fi
install -m 0644 "$HERE/gpufleet-publisher.service" "$ROOT/etc/systemd/system/gpufleet-publisher.service"
# The publisher runs as 'gpufleet', not root: this pair gives that user connect access to the kubelet's
# PodResources socket (an ACL entry) again each time the kubelet binds a new one (gpufleet_node/socket_access.py).
install -m 0644 "$HERE/gpufleet-podresources-access.path" "$ROOT/etc/systemd/system/gpufleet-podresources-access.path"
install -m 0644 "$HERE/gpufleet-podresources-access.service" \
  "$ROOT/etc/systemd/system/gpufleet-podresources-access.service"
# `gpufleet-node busy -- COMMAND`: queue workers keep their node while they hold a job (docs/node-publisher.md).
# Its jobs count themselves in /run/gpufleet-busy, shared by every worker user on the node (tmpfiles.d).
install -d -m 0755 "$ROOT/usr/local/bin" "$ROOT/etc/tmpfiles.d"
cat > "$ROOT/usr/local/bin/gpufleet-node" <<'WRAPPER'
#!/bin/sh
PYTHONPATH=/opt/gpufleet/lib${PYTHONPATH:+:$PYTHONPATH} exec /usr/bin/python3 -m gpufleet_node.cli "$@"
WRAPPER
chmod 0755 "$ROOT/usr/local/bin/gpufleet-node"
echo "d /run/gpufleet-busy 0777 root root -" > "$ROOT/etc/tmpfiles.d/gpufleet-busy.conf"
if [[ ! -e "$ROOT/etc/gpufleet/publisher.json" ]]; then  # keep an operator's edits on re-install
  install -m 0644 "$HERE/publisher.json" "$ROOT/etc/gpufleet/publisher.json"
fi

if [[ "$ROOT" == "" ]]; then  # the real system: account, enable
  getent group gpufleet >/dev/null || groupadd --system gpufleet
  getent passwd gpufleet >/dev/null || useradd --system --gid gpufleet --groups video --no-create-home \
    --shell /sbin/nologin gpufleet
  chown -R gpufleet:gpufleet /var/lib/gpufleet
  systemd-tmpfiles --create /etc/tmpfiles.d/gpufleet-busy.conf || true
  systemctl daemon-reload
  systemctl enable gpufleet-publisher.service gpufleet-podresources-access.path
fi
echo "gpufleet publisher installed into ${ROOT:-/}"
