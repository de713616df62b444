#!/usr/bin/env bash
# The Slurm launcher for real: munged, slurmctld and slurmd (Debian's munge and slurm-wlm) run on
# this host from a private directory (a minimal slurm.conf: one node, proctrack/linuxproc,
# task/none, their own ports and munge socket), and deploy/slurm/rlhfd-cluster.sbatch runs the
# quickstart job (configs/demo-digits.yaml, shortened) through `sbatch --wait`: the batch job must
# exit 0 (the rlhfd job succeeded) and its output show the job's steps.
#   tests/integration/slurm_test.sh REPO_ROOT BUILD_DIR      (exit 77: skipped, no Slurm or not root)
set -euo pipefail
repo="$(cd "$1" && pwd)"
build="$(cd "$2" && pwd)"
for tool in munged mungekey slurmctld slurmd sbatch scontrol; do
  command -v "${tool}" >/dev/null || { echo "slurm_test: ${tool} missing (deploy/setup.sh installs slurm-wlm and munge): skipped"; exit 77; }
done
[[ $(id -u) == 0 ]] || { echo "slurm_test: slurmd runs as root: skipped"; exit 77; }

run="$(mktemp -d /tmp/rlhfd-slurm-test-XXXXXX)"
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
stop() {
  for pid_file in "${run}/state/slurmd.pid" "${run}/state/slurmctld.pid" "${run}/munge/munged.pid"; do
    [[ -s "${pid_file}" ]] && kill "$(cat "${pid_file}")" 2>/dev/null || true
  done
  sleep 1
  rm -rf "${run}"
}
trap stop EXIT
mkdir -p "${run}"/{munge,spool,state,log,bin}
chmod 700 "${run}/munge"
mungekey --create --keyfile="${run}/munge/munge.key" --force
munged --force --socket="${run}/munge/munge.sock" --key-file="${run}/munge/munge.key" \
  --log-file="${run}/log/munged.log" --pid-file="${run}/munge/munged.pid" \
  --seed-file="${run}/munge/munged.seed"
node=$(hostname)
cat > "${run}/slurm.conf" <<CONF
ClusterName=rlhfdtest
SlurmctldHost=${node}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=${run}/munge/munge.sock
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
SlurmctldPort=$(free_port)
SlurmdPort=$(free_port)
SlurmctldPidFile=${run}/state/slurmctld.pid
SlurmdPidFile=${run}/state/slurmd.pid
SlurmdSpoolDir=${run}/spool
StateSaveLocation=${run}/state
SlurmctldLogFile=${run}/log/slurmctld.log
SlurmdLogFile=${run}/log/slurmd.log
JobCompType=jobcomp/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
NodeName=${node} CPUs=$(nproc) State=UNKNOWN
PartitionName=rlhfd Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
CONF
export SLURM_CONF="${run}/slurm.conf"
slurmctld -f "${SLURM_CONF}"
slurmd -f "${SLURM_CONF}"
for _ in $(seq 100); do sinfo -h -o %T 2>/dev/null | grep -q idle && break; sleep 0.2; done
sinfo

ln -s "${build}/controller/rlhfd-controller" "${build}/worker/rlhfd-worker" \
  "${build}/controller/rlhfctl" "${run}/bin/"
# The batch job's environment: where the binaries are, two CPU workers, a free port.
export RLHFD_BIN_DIR="${run}/bin" RLHFD_CPU_WORKERS=2 RLHFD_PORT="$(free_port)"
export RLHFD_STATE_DIR="${run}/rlhfd-state"
cd "${repo}"
status=0
sbatch --wait --nodes=1 --output="${run}/job.out" deploy/slurm/rlhfd-cluster.sbatch \
  configs/demo-digits.yaml trainer.total_steps=20 trainer.val_every=-1 || status=$?
cat "${run}/job.out"
echo "slurm_test: sbatch exited ${status}"
[[ ${status} == 0 ]] || { cat "${run}/rlhfd-state/controller.log" "${run}/rlhfd-state/workers.log" | tail -40; exit 1; }
grep -q "succeeded: finished 20 steps" "${run}/job.out"
grep -q "WORKER_STATE_ALIVE\|alive" "${run}/job.out"
