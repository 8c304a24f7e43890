#!/usr/bin/env bash
# A real two-node SLURM cluster on this one machine, for the test suite and for trying the
# templates: Debian's slurmctld + two slurmd daemons (node1, node2) + munge.
#
#   bash slurm/local-cluster.sh install   # apt-get install slurmctld slurmd slurm-client munge (root)
#   bash slurm/local-cluster.sh start     # write the config, start munged, slurmctld, slurmd x2; wait for idle nodes
#   bash slurm/local-cluster.sh stop
#   bash slurm/local-cluster.sh logs      # the daemons' logs (printed when start fails)
#
# Everything lives under $GLM_SLURM_DIR (default /tmp/glm-slurm); /etc/slurm/slurm.conf is
# written because the client commands read it from there.
set -uo pipefail
DIR=${GLM_SLURM_DIR:-/tmp/glm-slurm}
CONF=/etc/slurm/slurm.conf
HOST=$(hostname)
CPUS=$(nproc)
MEM_MB=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 / 4 ))

logs() {
  for f in "$DIR"/log/*.log; do echo "===== $f"; tail -n 40 "$f"; done
}

install() {
  command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v sbatch >/dev/null \
    && command -v munged >/dev/null && return 0
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq && apt-get install -y -qq slurmctld slurmd slurm-client munge >/dev/null
}

write_config() {
  mkdir -p "$DIR"/{log,state,spool/node1,spool/node2,run} /etc/slurm
  cat > "$CONF" <<EOF
ClusterName=glmlocal
SlurmctldHost=$HOST(127.0.0.1)
SlurmctldPort=16817
SlurmdPort=17001
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
# Job credentials live 5 s (default 120; Slurm refuses less): a requeued job waits this long (+1 s)
# before it may start again. A credential only has to reach a slurmd on this machine, which takes
# milliseconds. The main scheduler runs every second (default 60) and backfill too (default 30): a
# job that becomes eligible with no event to wake the scheduler started 5-28 s late otherwise. With
# 15 s and the defaults the preemption test's requeued job started 21-44 s after the requeue; now 6 s.
AuthInfo=cred_expire=5
SchedulerParameters=bf_interval=1,sched_interval=1
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool/%n
SlurmctldPidFile=$DIR/run/slurmctld.pid
SlurmdPidFile=$DIR/run/slurmd-%n.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SwitchType=switch/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
KillWait=30
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
MinJobAge=600
NodeName=node[1-2] NodeHostname=$HOST NodeAddr=127.0.0.1 Port=17001-17002 CPUs=$CPUS RealMemory=$MEM_MB State=UNKNOWN
PartitionName=debug Nodes=node[1-2] Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:2
EOF
  # The node names must resolve (slurmd, srun and torchrun's rendezvous look them up).
  grep -qE '^127\.0\.0\.1\s+.*\bnode1\b' /etc/hosts || echo "127.0.0.1 node1 node2" >> /etc/hosts
}

start_munge() {
  mkdir -p /run/munge /var/log/munge /var/lib/munge /etc/munge
  [ -s /etc/munge/munge.key ] || dd if=/dev/urandom of=/etc/munge/munge.key bs=1 count=1024 status=none
  chown -R munge:munge /run/munge /var/log/munge /var/lib/munge /etc/munge
  chmod 0700 /etc/munge /var/lib/munge; chmod 0400 /etc/munge/munge.key; chmod 0755 /run/munge
  if ! munge -n >/dev/null 2>&1; then
    su -s /bin/sh munge -c "/usr/sbin/munged" 2>>"$DIR/log/munged.log" || /usr/sbin/munged --force 2>>"$DIR/log/munged.log"
    sleep 1
  fi
  munge -n | unmunge >/dev/null || { echo "munge does not work" >&2; return 1; }
}

start() {
  install || { echo "could not install SLURM packages" >&2; exit 1; }
  stop >/dev/null 2>&1
  write_config
  start_munge || { logs; exit 1; }
  /usr/sbin/slurmctld -i >>"$DIR/log/slurmctld.stdout.log" 2>&1
  for n in node1 node2; do /usr/sbin/slurmd -N "$n" >>"$DIR/log/slurmd-$n.stdout.log" 2>&1; done
  for _ in $(seq 60); do
    if [ "$(sinfo -h -N -o '%t' 2>/dev/null | grep -c idle)" = 2 ]; then sinfo -N; return 0; fi
    sleep 1
  done
  echo "SLURM nodes did not become idle:" >&2
  sinfo -N >&2
  logs >&2
  exit 1
}

stop() {
  for f in "$DIR"/run/slurmd-*.pid "$DIR"/run/slurmctld.pid; do
    [ -f "$f" ] && kill "$(cat "$f")" 2>/dev/null
  done
  pkill -x slurmd 2>/dev/null; pkill -x slurmctld 2>/dev/null
  sleep 1
  return 0
}

case "${1:-}" in
  install) install ;;
  start) start ;;
  stop) stop ;;
  logs) logs ;;
  *) echo "usage: $0 install|start|stop|logs" >&2; exit 2 ;;
esac
