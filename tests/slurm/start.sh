#!/usr/bin/env bash
# Start a single-node Slurm on this machine (Debian: apt-get install slurm-wlm munge), as root:
#   sudo bash tests/slurm/start.sh [STATE_DIR]
# Writes /etc/slurm/slurm.conf and gres.conf from this folder, starts munged, slurmctld and slurmd, and waits
# for the node to be idle. The node registers with the CPUs, memory and one GPU the Slurm profile asks for
# (SlurmdParameters=config_overrides), so profiles/slurm runs unchanged on a small machine.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
state=${1:-/tmp/moespac-slurm}
node=$(hostname)
mkdir -p "$state/state" "$state/spool" /etc/slurm /run/munge /var/log/munge /var/lib/munge
sed -e "s|NODE|$node|g" -e "s|STATE|$state|g" "$here/slurm.conf" > /etc/slurm/slurm.conf
sed -e "s|NODE|$node|g" "$here/gres.conf" > /etc/slurm/gres.conf
chown -R munge:munge /run/munge /var/log/munge /var/lib/munge /etc/munge
chmod 700 /var/log/munge
pgrep -x munged > /dev/null || su munge -s /bin/sh -c munged
pkill -x slurmd || true
pkill -x slurmctld || true
sleep 1
slurmctld -f /etc/slurm/slurm.conf
sleep 2
slurmd -f /etc/slurm/slurm.conf
for _ in $(seq 30); do
  sinfo -h -o %t 2>/dev/null | grep -qx idle && { sinfo; exit 0; }
  scontrol update nodename="$node" state=resume > /dev/null 2>&1 || true
  sleep 1
done
echo "the node did not come up idle; see $state/slurmd.log and $state/slurmctld.log" >&2
exit 1
