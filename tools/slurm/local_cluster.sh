#!/usr/bin/env bash
# A SLURM cluster on this machine, for tests/test_slurm.py and tests/test_multi_node.py (CI runs it before the
# tests). Installs Debian's slurm-wlm daemons and munge with apt-get (needs root), writes /etc/slurm/slurm.conf
# with settings that work inside a container (no cgroups: proctrack/linuxproc, task/none; no accounting), starts
# munged, slurmctld and the slurmd daemons, and waits until sinfo shows every node idle.
#
# Layouts (the first argument, default 2):
#   1  one node named after this host, as a plain one-machine SLURM has it;
#   N  N nodes, node1 .. nodeN, each its own slurmd (`slurmd -N nodeI`) on its own port (6818 + I - 1) at
#      127.0.0.1, each with this machine's CPUs: a job of --nodes N gets N nodes and srun starts its tasks on
#      every one, as on a real cluster. Debian's build has no --enable-multiple-slurmd, which is not needed: each
#      node has a hostname of its own (NodeHostname), so no two nodes share one, and the names are added to
#      /etc/hosts (127.0.0.1) so that what resolves a node name on a cluster (Lightning's MASTER_ADDR from
#      SLURM_NODELIST) resolves them here. One-node jobs run on either node.
# Idempotent: re-running it keeps a running cluster and restarts the daemons only when slurm.conf changed.
# Usage: sudo bash tools/slurm/local_cluster.sh [NODES]      (stop: pkill -x slurmd; pkill -x slurmctld)
set -euo pipefail

nodes=${1:-2}
conf=/etc/slurm/slurm.conf
state=/var/spool/slurmctld
spool=/var/spool/slurmd
logs=/var/log/slurm
first_port=6818

if [ "$(id -u)" != 0 ]; then
  echo "local_cluster.sh: needs root (apt-get, daemons)" >&2
  exit 1
fi
if ! [[ "$nodes" =~ ^[1-9][0-9]*$ ]]; then
  echo "local_cluster.sh: NODES must be a count of at least 1, got '$nodes'" >&2
  exit 1
fi

if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null || ! command -v munged >/dev/null \
    || ! command -v sbatch >/dev/null; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends slurmctld slurmd slurm-client munge >/dev/null
fi

host=$(hostname -s)
cpus=$(nproc)
memory_mb=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 * 9 / 10 / nodes ))
names=()
if [ "$nodes" = 1 ]; then
  names=("$host")
else
  for i in $(seq "$nodes"); do names+=("node$i"); done
fi
# node1 .. nodeN resolve to this machine, as a cluster's DNS resolves its nodes (one line of our own, rewritten;
# none for the host's own name)
hosts=$(grep -v '# specdraft local_cluster.sh$' /etc/hosts || true)
if [ "$nodes" = 1 ]; then
  printf '%s\n' "$hosts" >/etc/hosts
else
  printf '%s\n127.0.0.1 %s # specdraft local_cluster.sh\n' "$hosts" "${names[*]}" >/etc/hosts
fi
mkdir -p /etc/slurm "$state" "$logs" /run/munge
for name in "${names[@]}"; do mkdir -p "$spool/$name"; done

node_lines() {
  local i=0 name
  for name in "${names[@]}"; do
    if [ "$nodes" = 1 ]; then
      echo "NodeName=$name NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$memory_mb State=UNKNOWN"
    else
      echo "NodeName=$name NodeHostname=$name NodeAddr=127.0.0.1 Port=$((first_port + i)) CPUs=$cpus" \
        "RealMemory=$memory_mb State=UNKNOWN"
    fi
    i=$((i + 1))
  done
}

new_conf=$(mktemp)
cat >"$new_conf" <<EOF
# Written by tools/slurm/local_cluster.sh: a $nodes-node test cluster on localhost, no cgroups, no accounting.
ClusterName=specdraft-local
SlurmctldHost=$host(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation=$state
SlurmdSpoolDir=$spool/%n
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd-%n.pid
SlurmctldLogFile=$logs/slurmctld.log
SlurmdLogFile=$logs/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
ReturnToService=2
MpiDefault=none
SwitchType=switch/none
JobRequeue=1
KillWait=10
MinJobAge=3600
SlurmctldTimeout=30
SlurmdTimeout=60
$(node_lines)
PartitionName=debug Nodes=$(IFS=,; echo "${names[*]}") Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
EOF

changed=0
if ! cmp -s "$new_conf" "$conf" 2>/dev/null; then
  install -m 644 "$new_conf" "$conf"
  changed=1
fi
rm -f "$new_conf"

if [ ! -s /etc/munge/munge.key ]; then
  mungekey --create --keyfile /etc/munge/munge.key 2>/dev/null || \
    dd if=/dev/urandom of=/etc/munge/munge.key bs=1 count=1024 status=none
fi
chown -R munge:munge /etc/munge /run/munge /var/lib/munge /var/log/munge 2>/dev/null || true
chmod 400 /etc/munge/munge.key
if ! pgrep -x munged >/dev/null; then
  runuser -u munge -- munged
fi

if [ "$changed" = 1 ]; then  # daemons started with another slurm.conf must re-read it
  pkill -x slurmd || true
  pkill -x slurmctld || true
  for _ in $(seq 30); do pgrep -x slurmd >/dev/null || pgrep -x slurmctld >/dev/null || break; sleep 0.5; done
fi
if ! pgrep -x slurmctld >/dev/null; then
  slurmctld
fi
for name in "${names[@]}"; do
  if [ "$nodes" = 1 ]; then
    pgrep -x slurmd >/dev/null || slurmd
  elif ! pgrep -x -f "slurmd -N $name" >/dev/null; then
    slurmd -N "$name"
  fi
done

for _ in $(seq 60); do
  if [ "$(sinfo -h -N -o '%N %T' 2>/dev/null | grep -cE ' (idle|mixed|allocated)$')" -ge "$nodes" ]; then
    sinfo -N
    exit 0
  fi
  for name in "${names[@]}"; do scontrol update nodename="$name" state=resume >/dev/null 2>&1 || true; done
  sleep 1
done
echo "local_cluster.sh: the nodes did not come up; see $logs/slurmctld.log and $logs/slurmd-NODE.log" >&2
sinfo -N -l >&2 || true
exit 1
