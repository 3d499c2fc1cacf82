#!/usr/bin/env bash
# A one-node SLURM cluster on this machine, for tests/test_slurm.py (CI runs it before the tests).
# Installs Debian's slurm-wlm daemons and munge with apt-get (needs root), writes /etc/slurm/slurm.conf for
# localhost with settings that work inside a container (no cgroups: proctrack/linuxproc, task/none; no
# accounting), starts munged, slurmctld and slurmd, and waits until sinfo shows the node idle.
# Idempotent: re-running it keeps a running cluster and restarts the daemons only when slurm.conf changed.
# Usage: sudo bash tools/slurm/local_cluster.sh        (stop: pkill -x slurmd; pkill -x slurmctld)
set -euo pipefail

conf=/etc/slurm/slurm.conf
state=/var/spool/slurmctld
spool=/var/spool/slurmd
logs=/var/log/slurm

if [ "$(id -u)" != 0 ]; then
  echo "local_cluster.sh: needs root (apt-get, daemons)" >&2
  exit 1
fi

if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null || ! command -v munged >/dev/null \
    || ! command -v sbatch >/dev/null; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends slurmctld slurmd slurm-client munge >/dev/null
fi

node=$(hostname -s)
cpus=$(nproc)
memory_mb=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 * 9 / 10 ))
mkdir -p /etc/slurm "$state" "$spool" "$logs" /run/munge
new_conf=$(mktemp)
cat >"$new_conf" <<EOF
# Written by tools/slurm/local_cluster.sh: a one-node test cluster on localhost, no cgroups, no accounting.
ClusterName=specdraft-local
SlurmctldHost=$node(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation=$state
SlurmdSpoolDir=$spool
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmctldLogFile=$logs/slurmctld.log
SlurmdLogFile=$logs/slurmd.log
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
NodeName=$node NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$memory_mb State=UNKNOWN
PartitionName=debug Nodes=$node Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
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
  sleep 1
fi
if ! pgrep -x slurmctld >/dev/null; then
  slurmctld
fi
if ! pgrep -x slurmd >/dev/null; then
  slurmd
fi

for _ in $(seq 60); do
  if sinfo -h -N -o '%T' 2>/dev/null | grep -qE '^(idle|mixed|allocated)'; then
    sinfo
    exit 0
  fi
  scontrol update nodename="$node" state=resume >/dev/null 2>&1 || true
  sleep 1
done
echo "local_cluster.sh: the node did not come up; see $logs/slurmctld.log and $logs/slurmd.log" >&2
sinfo -N -l >&2 || true
exit 1
