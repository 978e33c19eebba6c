#!/usr/bin/env bash
# HyperPod lifecycle step for the Slurm controller node: publish the GPU backlog and the idle nodes each minute.
#   install_gpufleet_controller.sh --group GROUP[=PART,...] [--group ...] [--cluster NAME] [--bundle DIR] [--root DIR]
#                                  [--marks-table TABLE]
#                                  [--block-imds-for-users [--imds-allow-user NAME ...]]
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
BUNDLE="$HERE/gpufleet"
ROOT=""
CLUSTER=""
RESOURCE_CONFIG="/opt/ml/config/resource_config.json"
DEPS=1
TARGETS=()
BLOCK_IMDS=0
IMDS_USERS=(root)
NODE_CACHE="/var/lib/gpufleet/hyperpod_nodes.json"
MARKS_TABLE=""
usage() {
  cat <<'USAGE'
Usage: install_gpufleet_controller.sh --group GROUP[=PART,...] [--group ...] [--cluster NAME]
                                      [--resource-config FILE] [--bundle DIR] [--root DIR] [--marks-table TABLE]
                                      [--block-imds-for-users [--imds-allow-user NAME ...]]

Installs ami/slurm_pending_gpus.py on the HyperPod Slurm controller node as a systemd timer that runs it
every minute with `--hyperpod CLUSTER:GROUP[=PART,...]` for each --group: PendingGPUs per instance group
and IdleNode per idle node, into the node's own namespace Slurm/<aws:userid> (docs/hyperpod.md). It runs as root, so Slurm's PrivateData
cannot hide other users' pending jobs from squeue. Offline: boto3 comes from the bundle's wheels.
The cluster name and region are read from HyperPod's resource file (ClusterConfig.ClusterName, the
region of ClusterConfig.ClusterArn) unless --cluster is given. Node ids the resource file lacks are read
with the node's role from the SageMaker API (ListClusterNodes, DescribeClusterNode: execution-role-controller.json)
and cached in /var/lib/gpufleet/hyperpod_nodes.json.

  --group G[=P,...]      an instance group gpufleet scales, and the Slurm partitions whose jobs it runs
                         (repeatable; a group without partitions takes the jobs no other group names)
  --cluster NAME         the HyperPod cluster (default: from the resource file)
  --resource-config FILE HyperPod's resource file (default /opt/ml/config/resource_config.json)
  --marks-table TABLE    gpufleet's state table (its stack output StateTableName): apply the Slurm drains
                         gpufleet asks for (consolidation by attrition; scontrol drain/resume, as root; the
                         role needs execution-role-controller.json's ReadGpufleetSlurmDrainsOnly). Without it
                         no node is ever drained or resumed by gpufleet.
  --bundle DIR           the staged bundle (default: ./gpufleet next to this script)
  --root DIR             install under DIR instead of / (tests: no systemctl)
  --no-deps              do not pip-install boto3 (tests)
  --block-imds-for-users opt in: a boot-time iptables rule (owner match) that rejects the instance metadata
                         service for every local user but root and --imds-allow-user: a user of this node
                         could otherwise take its role's credentials and put IdleNode=1 for a node that runs
                         someone's job (docs/security.md). Check first which daemons need IMDS.
  --imds-allow-user NAME a user that keeps IMDS (repeatable; e.g. the CloudWatch agent's cwagent)
  -h, --help             this text
USAGE
}
while [[ $# -gt 0 ]]; do
  case "$1" in
    -h|--help) usage; exit 0 ;;
    --group) TARGETS+=("$2"); shift 2 ;;
    --cluster) CLUSTER="$2"; shift 2 ;;
    --resource-config) RESOURCE_CONFIG="$2"; shift 2 ;;
    --marks-table) MARKS_TABLE="$2"; shift 2 ;;
    --bundle) BUNDLE="$2"; shift 2 ;;
    --root) ROOT="${2%/}"; shift 2 ;;
    --no-deps) DEPS=0; shift ;;
    --block-imds-for-users) BLOCK_IMDS=1; shift ;;
    --imds-allow-user) IMDS_USERS+=("$2"); shift 2 ;;
    *) echo "install_gpufleet_controller.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
[[ ${#TARGETS[@]} -gt 0 ]] || { echo "install_gpufleet_controller.sh: at least one --group (see --help)" >&2; exit 2; }

PY=""
for candidate in python3.12 python3.11 python3.10 python3.9 python3; do
  path="$(command -v "$candidate" || true)"
  if [[ -n "$path" ]] && "$path" -c 'import sys; sys.exit(sys.version_info < (3, 9))' 2>/dev/null; then
    PY="$path"
    break
  fi
done
[[ -n "$PY" ]] || { echo "gpufleet: no Python >= 3.9 on this node: backlog publisher not installed" >&2; exit 1; }

read -r FOUND_CLUSTER REGION < <("$PY" - "$RESOURCE_CONFIG" <<'PYREAD'
import json, sys
try:
    with open(sys.argv[1]) as f:
        cfg = json.load(f).get("ClusterConfig") or {}
except (OSError, ValueError):
    cfg = {}
arn = str(cfg.get("ClusterArn") or "")
print(cfg.get("ClusterName") or "-", arn.split(":")[3] if arn.count(":") >= 5 else "-")
PYREAD
)
[[ -n "$CLUSTER" ]] || CLUSTER="$FOUND_CLUSTER"
[[ "$CLUSTER" != "-" ]] || { echo "gpufleet: no cluster name: give --cluster (no $RESOURCE_CONFIG)" >&2; exit 1; }

LIB="$ROOT/opt/gpufleet/lib"
BIN="$ROOT/opt/gpufleet/bin"
UNITS="$ROOT/etc/systemd/system"
install -d -m 0755 "$LIB" "$BIN" "$UNITS"
if [[ "$DEPS" == 1 ]]; then  # offline: only the staged wheels, never an index
  "$PY" -m pip install --quiet --no-compile --no-index --find-links "$BUNDLE/wheels" --target "$LIB" boto3
fi
install -m 0755 "$BUNDLE/ami/slurm_pending_gpus.py" "$BIN/slurm_pending_gpus.py"

ARGS=""
for g in "${TARGETS[@]}"; do ARGS+=" --hyperpod $CLUSTER:$g"; done
[[ "$REGION" == "-" ]] || ARGS+=" --region $REGION"
ARGS+=" --resource-config $RESOURCE_CONFIG --node-cache $NODE_CACHE"
if [[ -n "$MARKS_TABLE" ]]; then
  [[ "$MARKS_TABLE" =~ ^[A-Za-z0-9_.-]{3,255}$ ]] || { echo "gpufleet: --marks-table: not a DynamoDB table name" >&2; exit 2; }
  ARGS+=" --marks-table $MARKS_TABLE"
fi

cat > "$UNITS/gpufleet-slurm-backlog.service" <<UNIT
[Unit]
Description=gpufleet: Slurm GPU backlog and idle HyperPod nodes -> CloudWatch (namespace Slurm/<this node's aws:userid>)
After=network-online.target slurmctld.service
Wants=network-online.target

[Service]
Type=oneshot
Environment=PYTHONPATH=/opt/gpufleet/lib
Environment=PATH=/opt/slurm/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
ExecStart=$PY /opt/gpufleet/bin/slurm_pending_gpus.py$ARGS
TimeoutStartSec=50s
NoNewPrivileges=yes
StateDirectory=gpufleet
ProtectSystem=strict
ProtectHome=yes
PrivateTmp=yes
UNIT

cat > "$UNITS/gpufleet-slurm-backlog.timer" <<'UNIT'
[Unit]
Description=gpufleet: publish the Slurm backlog every minute

[Timer]
OnCalendar=*-*-* *:*:00
AccuracySec=1s
Persistent=false

[Install]
WantedBy=timers.target
UNIT

GUARD=""
if [[ "$BLOCK_IMDS" == 1 ]]; then  # IPv4 and IPv6 endpoints; each allowed user's ACCEPT goes before the REJECT
  RULES=""
  for ip in "iptables 169.254.169.254 +" "ip6tables fd00:ec2::254 -"; do
    read -r tool addr ok <<<"$ip"  # ok "-": a failure is ignored (a node without IPv6); IPv4 must hold
    [[ "$ok" == "-" ]] || ok=""
    for u in "${IMDS_USERS[@]}"; do
      RULES+="ExecStart=${ok}/bin/sh -c '$tool -C OUTPUT -d $addr -m owner --uid-owner $u -j ACCEPT 2>/dev/null || $tool -A OUTPUT -d $addr -m owner --uid-owner $u -j ACCEPT'"$'\n'
    done
    RULES+="ExecStart=${ok}/bin/sh -c '$tool -C OUTPUT -d $addr -j REJECT 2>/dev/null || $tool -A OUTPUT -d $addr -j REJECT'"$'\n'
  done
  cat > "$UNITS/gpufleet-imds-guard.service" <<UNIT
[Unit]
Description=gpufleet: only ${IMDS_USERS[*]} may reach the instance metadata service (docs/security.md)
After=network-pre.target
Before=network-online.target

[Service]
Type=oneshot
RemainAfterExit=yes
${RULES}
[Install]
WantedBy=multi-user.target
UNIT
  GUARD="gpufleet-imds-guard.service"
fi

if [[ -z "$ROOT" ]]; then
  systemctl daemon-reload
  systemctl enable --now gpufleet-slurm-backlog.timer
  [[ -z "$GUARD" ]] || systemctl enable --now "$GUARD"
fi
echo "gpufleet backlog publisher installed into ${ROOT:-/}:$ARGS"
