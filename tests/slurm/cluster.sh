#!/usr/bin/env bash
# A single-node Slurm cluster for the test suite: slurmctld + slurmd + munged, with slurmdbd and
# MariaDB so that `sacct` (the status command of snakemake-executor-plugin-slurm) works.
#
#   tests/slurm/cluster.sh up       # install packages if missing, start the daemons (idempotent)
#   tests/slurm/cluster.sh status   # exit 0 when every daemon is alive and the node takes jobs
#   tests/slurm/cluster.sh down     # stop the daemons by PID; keeps the database and job state
#   tests/slurm/cluster.sh down --purge   # ... and delete the state directory
#
# Two more nodes, codl-n1 and codl-n2 (partition `twonode`), each a slurmd in its own network,
# UTS and mount namespace: own hostname, own address on a private bridge ($BRIDGE, created here
# with the controller's address on it, no forwarding, no NAT), own /etc/hosts naming the nodes.
# Multi-node jobs (srun across nodes, torch.distributed rendezvous by hostname) run on them.
# Skipped with the reason in $STATE/twonode where namespaces cannot be created.
#
# Needs root. There is no init system in the containers we test in, so every daemon is started
# directly in the foreground in its own session, and its PID is written to $STATE/pid/<name>.pid.
# Generated configuration lives in $STATE/etc; clients find it through `source $STATE/env.sh`.
#
# Environment: CODL_SLURM_STATE (default /tmp/codl-slurm), CODL_SLURM_DB_PORT (default 13306),
# CODL_SLURM_CGROUP = auto|yes|no (default auto: cgroup plugins only where cgroup v1 is writable),
# CODL_SLURM_TWONODE = auto|yes|no (default auto: the two namespaced nodes where they can be made),
# CODL_SLURM_NET (default 10.231.0: the private /24 of the bridge; .1 controller, .11/.12 nodes).
set -euo pipefail

STATE=${CODL_SLURM_STATE:-/tmp/codl-slurm}
DB_PORT=${CODL_SLURM_DB_PORT:-13306}
CGROUP_MODE=${CODL_SLURM_CGROUP:-auto}
CLUSTER=codl
ACCOUNT=codl
PARTITION=debug
NODE=$(hostname -s)
ETC=$STATE/etc
DAEMONS=(munged mariadbd slurmdbd slurmctld slurmd)
TWONODE_MODE=${CODL_SLURM_TWONODE:-auto}
NET=${CODL_SLURM_NET:-10.231.0}
BRIDGE=codlbr0
TWO_NODES=(codl-n1 codl-n2)
TWO_PARTITION=twonode
PACKAGES=(munge mariadb-server slurmdbd slurmctld slurmd slurm-client)
COMMANDS=(munged mungekey mariadbd mariadb-install-db mariadb slurmdbd slurmctld slurmd sbatch
    sacct sacctmgr squeue sinfo scontrol srun)

log() { printf 'cluster.sh: %s\n' "$*" >&2; }
die() {
    log "error: $*"
    exit 1
}

# Deadlines are generous: they are polls, so a healthy start costs no more; a loaded 2-core
# machine can take many seconds to start a daemon (munged, MariaDB, slurmctld).
# Polls "$@" every 0.5 s for at most $1 seconds.
wait_for() {
    local timeout=$1
    shift
    local end=$((SECONDS + timeout))
    until "$@" >/dev/null 2>&1; do
        ((SECONDS < end)) || return 1
        sleep 0.5
    done
}

# Like wait_for, but gives up at once when daemon $1, just started, has exited. Not `alive`:
# until `start`'s chain of execs (setsid, setpriv, nsenter, ...) reaches the daemon, its PID
# has another name, and under load a poll sees that name ("munged did not start" while munged
# was starting).
wait_daemon() {
    local name=$1 timeout=$2
    shift 2
    local end=$((SECONDS + timeout))
    until "$@" >/dev/null 2>&1; do
        running "$(pid_of "$name")" && ((SECONDS < end)) || return 1
        sleep 0.5
    done
}

# PID $1 exists and has not exited (a child not yet reaped is a zombie, state Z).
running() {
    local stat
    [[ -n $1 ]] && stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
    stat=${stat##*) }
    [[ ${stat%% *} != Z ]]
}

pid_of() { cat "$STATE/pid/$1.pid" 2>/dev/null || true; }

# A PID file can outlive its process and the PID be reused: also check the command name
# (`slurmd@codl-n1` is a slurmd).
alive() {
    local pid
    pid=$(pid_of "$1")
    [[ -n $pid ]] && [[ -r /proc/$pid/comm ]] && [[ $(cat "/proc/$pid/comm") == "${1%%@*}"* ]]
}

# Starts "$@" as daemon $name in the foreground of a new session; stdout to $STATE/log/$name.out.
# `setpriv` (not runuser/su) execs in place, so $! is the daemon's own PID.
start() {
    local name=$1
    shift
    setsid "$@" >>"$STATE/log/$name.out" 2>&1 </dev/null &
    echo $! >"$STATE/pid/$name.pid"
}

as_user() {
    local user=$1
    shift
    setpriv --reuid="$user" --regid="$user" --init-groups -- "$@"
}

export_env() {
    export SLURM_CONF=$ETC/slurm.conf
}

# apt-get that waits for the dpkg/apt locks instead of failing when another apt process (an
# unattended upgrade, a second test session) holds them: DPkg::Lock::Timeout makes apt >= 1.9.11
# wait by itself; the loop covers older apt and the lists lock of `apt-get update`.
APT_LOCK_TRIES=${CODL_APT_LOCK_TRIES:-60}
apt_get() {
    local try out rc
    for ((try = 1; try <= APT_LOCK_TRIES; try++)); do
        rc=0
        out=$(apt-get -o DPkg::Lock::Timeout=60 "$@" 2>&1) || rc=$?
        if ((rc == 0)); then
            [[ -z $out ]] || printf '%s\n' "$out"
            return 0
        fi
        if ! grep -qiE 'could not get lock|unable to acquire the dpkg|unable to lock' <<<"$out"; then
            printf '%s\n' "$out" >&2
            return "$rc"
        fi
        log "apt/dpkg lock held by another process; waiting (try $try of $APT_LOCK_TRIES)"
        sleep 10
    done
    printf '%s\n' "$out" >&2
    return "$rc"
}

install_packages() {
    local missing=0 c
    for c in "${COMMANDS[@]}"; do
        command -v "$c" >/dev/null || missing=1
    done
    ((missing)) || return 0
    log "installing ${PACKAGES[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt_get update -qq
    # The postinst scripts try to start the services through invoke-rc.d; without an init system
    # that fails harmlessly ("policy-rc.d denied execution"), we start them ourselves below.
    apt_get install -y -qq --no-install-recommends "${PACKAGES[@]}" >/dev/null
}

cgroup_plugins_usable() {
    case $CGROUP_MODE in
        yes) return 0 ;;
        no) return 1 ;;
    esac
    # Slurm 22.05's cgroup/v2 plugin wants slurmd started by systemd with Delegate=yes; with no
    # systemd in the container only cgroup v1 can work, and only if its hierarchies are writable
    # (a container usually gets them read-only).
    [[ $(stat -fc %T /sys/fs/cgroup) == tmpfs ]] || return 1
    local c
    for c in freezer cpuset memory devices; do
        mkdir "/sys/fs/cgroup/$c/codl-probe.$$" 2>/dev/null || return 1
        rmdir "/sys/fs/cgroup/$c/codl-probe.$$"
    done
}

write_configs() {
    local hw cpus mem proctrack task
    # The node must advertise what slurmd detects, else slurmd registers it as INVALID.
    hw=$(slurmd -C | head -n1)
    cpus=$(sed -n 's/.* CPUs=\([0-9]*\).*/\1/p' <<<"$hw")
    mem=$(sed -n 's/.* RealMemory=\([0-9]*\).*/\1/p' <<<"$hw")
    if cgroup_plugins_usable; then
        proctrack=proctrack/cgroup task=task/cgroup,task/affinity
        cat >"$ETC/cgroup.conf" <<EOF
CgroupPlugin=cgroup/v1
CgroupAutomount=yes
ConstrainCores=yes
ConstrainRAMSpace=yes
ConstrainDevices=no
EOF
    else
        # No writable cgroup hierarchy: track processes by parent PID, and bind CPUs with
        # sched_setaffinity. The binding is advisory: a job can widen its own CPU mask.
        proctrack=proctrack/linuxproc task=task/affinity
        rm -f "$ETC/cgroup.conf"
    fi
    local ctld_host=$NODE
    # The namespaced nodes reach the controller through the bridge only.
    if twonode_on; then ctld_host="$NODE($NET.1)"; fi
    cat >"$ETC/slurm.conf" <<EOF
# Generated by tests/slurm/cluster.sh; regenerated on every \`up\`.
ClusterName=$CLUSTER
SlurmctldHost=$ctld_host
SlurmUser=slurm
AuthType=auth/munge
StateSaveLocation=$STATE/spool/ctld
# %n: one spool directory and PID file per slurmd (three may run on this machine).
SlurmdSpoolDir=$STATE/spool/d/%n
SlurmctldPidFile=$STATE/run/slurmctld.pid
SlurmdPidFile=$STATE/run/slurmd-%n.pid
SlurmctldLogFile=$STATE/log/slurmctld.log
SlurmdLogFile=$STATE/log/slurmd.log
ReturnToService=2
ProctrackType=$proctrack
TaskPlugin=$task
SchedulerType=sched/backfill
# Cores and memory are consumable: several jobs share the node, each confined to what it asked.
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
# Without a default, a job that does not ask for memory is given the whole node's memory.
DefMemPerCPU=1000
# Keep finished jobs in slurmctld for a day, so that \`squeue\`-based status checks see them too.
MinJobAge=86400
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
AccountingStorageEnforce=associations
JobAcctGatherType=jobacct_gather/linux
JobAcctGatherFrequency=5
JobCompType=jobcomp/none
MpiDefault=none
SlurmctldTimeout=30
SlurmdTimeout=30
NodeName=$NODE CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=$PARTITION Nodes=$NODE Default=YES MaxTime=INFINITE State=UP
EOF
    if twonode_on; then write_twonode_conf "$cpus" "$mem"; fi
    # slurmdbd.conf holds the database password: slurmdbd refuses it unless owned by SlurmUser
    # with mode 600.
    install -m 600 -o slurm -g slurm /dev/null "$ETC/slurmdbd.conf"
    cat >"$ETC/slurmdbd.conf" <<EOF
AuthType=auth/munge
DbdHost=localhost
SlurmUser=slurm
PidFile=$STATE/run/slurmdbd.pid
LogFile=$STATE/log/slurmdbd.log
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$DB_PORT
StorageUser=slurm
StoragePass=codl-test
StorageLoc=slurm_acct_db
EOF
    link_system_conf
    cat >"$STATE/env.sh" <<EOF
# source this file to talk to the CoDL test cluster
export SLURM_CONF=$ETC/slurm.conf
# read by profiles/slurm/config.yaml
export CODL_SLURM_PARTITION=$PARTITION
export CODL_SLURM_ACCOUNT=$ACCOUNT
# the partition of the two namespaced nodes; empty when they could not be made (see $STATE/twonode)
export CODL_SLURM_TWONODE_PARTITION=$(if twonode_on; then echo "$TWO_PARTITION"; fi)
EOF
}

# --- the two namespaced nodes ------------------------------------------------------------------

twonode_on() { [[ $(head -n1 "$STATE/twonode" 2>/dev/null) == on ]]; }
two_nodes_csv() {
    local IFS=,
    echo "${TWO_NODES[*]}"
}

# Decides once per `up` whether the two nodes can be made here, and records why not.
twonode_decide() {
    local why=""
    case $TWONODE_MODE in
        no) why="CODL_SLURM_TWONODE=no" ;;
        yes | auto)
            if ! command -v ip >/dev/null; then
                why="iproute2 (ip) is not installed"
            elif ! ip netns add "codl-probe-$$" 2>/dev/null; then
                why="cannot create a network namespace (ip netns add failed)"
            else
                ip netns del "codl-probe-$$"
                if ip link add "codlprobe$$" type bridge 2>/dev/null; then
                    ip link del "codlprobe$$"
                else
                    why="cannot create a bridge (ip link add type bridge failed)"
                fi
                unshare --uts --mount true 2>/dev/null || why="cannot create UTS/mount namespaces"
            fi
            ;;
        *) die "CODL_SLURM_TWONODE=$TWONODE_MODE: expected auto, yes or no" ;;
    esac
    if [[ -z $why ]]; then
        echo on >"$STATE/twonode"
    else
        [[ $TWONODE_MODE == yes ]] && die "two-node cluster requested but $why"
        printf 'off\n%s\n' "$why" >"$STATE/twonode"
        log "two namespaced nodes skipped: $why"
    fi
}

write_twonode_conf() {
    local cpus=$1 mem=$2 i
    for i in "${!TWO_NODES[@]}"; do
        echo "NodeName=${TWO_NODES[i]} NodeAddr=$NET.$((11 + i)) CPUs=$cpus RealMemory=$mem State=UNKNOWN"
    done >>"$ETC/slurm.conf"
    echo "PartitionName=$TWO_PARTITION Nodes=$(two_nodes_csv) Default=NO MaxTime=INFINITE State=UP" \
        >>"$ETC/slurm.conf"
    # The nodes' own /etc/hosts (bound over it in their mount namespace): ranks find rank 0's
    # node by name (the job's first host), as on a real cluster.
    {
        echo "127.0.0.1 localhost"
        echo "$NET.1 $NODE"
        for i in "${!TWO_NODES[@]}"; do echo "$NET.$((11 + i)) ${TWO_NODES[i]}"; done
    } >"$ETC/hosts"
}

# Bridge with the controller's address, one named netns per node with its end of a veth pair on
# the bridge. Idempotent: existing pieces are kept, addresses are replaced.
net_up() {
    local i ns
    ip link show "$BRIDGE" >/dev/null 2>&1 || ip link add "$BRIDGE" type bridge
    ip addr replace "$NET.1/24" dev "$BRIDGE"
    ip link set "$BRIDGE" up
    for i in "${!TWO_NODES[@]}"; do
        ns=${TWO_NODES[i]}
        [[ -e /run/netns/$ns ]] || ip netns add "$ns"
        if ! ip link show "${ns}h" >/dev/null 2>&1; then
            ip link add "${ns}h" type veth peer name eth0 netns "$ns"
        fi
        ip link set "${ns}h" master "$BRIDGE" up
        ip -n "$ns" addr replace "$NET.$((11 + i))/24" dev eth0
        ip -n "$ns" link set eth0 up
        ip -n "$ns" link set lo up
    done
}

net_down() {
    local ns
    for ns in "${TWO_NODES[@]}"; do
        # Deleting the namespace deletes its veth pair.
        if [[ -e /run/netns/$ns ]]; then ip netns del "$ns"; fi
    done
    if ip link show "$BRIDGE" >/dev/null 2>&1; then ip link del "$BRIDGE"; fi
}

# slurmd of node $1 in its netns, with its own UTS namespace (hostname) and a private mount
# namespace where the cluster's hosts file is bound over /etc/hosts. Not `ip netns exec`: it
# remounts /sys, which hides the cgroup hierarchies that proctrack/cgroup needs. Every step
# execs in place, so the PID recorded is slurmd's.
start_node() {
    local n=$1
    alive "slurmd@$n" && return 0
    # shellcheck disable=SC2016 # expanded by the inner sh
    start "slurmd@$n" nsenter --net="/run/netns/$n" unshare --uts --mount -- sh -c \
        'hostname "$1" && mount --bind "$2" /etc/hosts && exec slurmd -D -N "$1" -L "$3"' \
        sh "$n" "$ETC/hosts" "$STATE/log/slurmd-$n.log"
}

twonode_ready() {
    local states
    states=$(sinfo -h -p "$TWO_PARTITION" -o %T 2>/dev/null | sort -u)
    [[ -n $states ]] && ! grep -qvE '^(idle|mixed|allocated)$' <<<"$states"
}

start_twonode() {
    twonode_on || return 0
    local n
    for n in "${TWO_NODES[@]}"; do start_node "$n"; done
    if ! wait_for 120 twonode_ready; then
        scontrol update nodename="$(two_nodes_csv)" state=resume 2>/dev/null || true
        wait_for 60 twonode_ready ||
            die "partition $TWO_PARTITION is not idle: $STATE/log/slurmd-codl-n*.log, slurmctld.log"
    fi
}

# The daemons `status` and `down` look after: the namespaced slurmds only when they are on.
daemons() {
    local n
    printf '%s\n' "${DAEMONS[@]}"
    if twonode_on; then for n in "${TWO_NODES[@]}"; do echo "slurmd@$n"; done; fi
}

# snakemake-executor-plugin-slurm-jobstep strips every SLURM_* variable but the job's identity
# (SLURM_CONF included) before it runs `srun ... snakemake` inside the job; that srun then finds no
# configuration ("fetch_config: DNS SRV lookup failed") unless slurm.conf is at the compiled-in
# path. So link it there, unless a real cluster's slurm.conf already lives there.
SYSTEM_CONF=/etc/slurm/slurm.conf
link_system_conf() {
    if [[ -e $SYSTEM_CONF || -L $SYSTEM_CONF ]] && [[ $(readlink "$SYSTEM_CONF") != "$ETC/slurm.conf" ]]; then
        log "warning: $SYSTEM_CONF exists and is not ours; jobs run by Snakemake's slurm plugin will use it"
        return 0
    fi
    install -d /etc/slurm
    ln -sfn "$ETC/slurm.conf" "$SYSTEM_CONF"
}

unlink_system_conf() {
    if [[ -L $SYSTEM_CONF && $(readlink "$SYSTEM_CONF") == "$ETC/slurm.conf" ]]; then
        rm -f "$SYSTEM_CONF"
    fi
}

start_munge() {
    alive munged && return 0
    # munged refuses to run as root; it runs as user munge, whose socket directory must exist.
    install -d -m 755 -o munge -g munge /run/munge /var/lib/munge
    install -d -m 700 -o munge -g munge /var/log/munge
    [[ -s /etc/munge/munge.key ]] || as_user munge mungekey --create
    start munged setpriv --reuid=munge --regid=munge --init-groups -- munged --foreground
    wait_daemon munged 120 bash -c 'munge -n | unmunge' || die "munged did not start: $STATE/log/munged.out, /var/log/munge/munged.log"
}

mysql_root() { mariadb --no-defaults --protocol=socket --socket="$STATE/mysql/mysqld.sock" -uroot "$@"; }

start_mariadb() {
    alive mariadbd && return 0
    if [[ ! -d $STATE/mysql/mysql ]]; then
        log "initialising the accounting database in $STATE/mysql"
        install -d -o mysql -g mysql "$STATE/mysql"
        mariadb-install-db --no-defaults --user=mysql --datadir="$STATE/mysql" \
            --auth-root-authentication-method=socket --skip-test-db >>"$STATE/log/mariadbd.out" 2>&1 ||
            die "mariadb-install-db failed: $STATE/log/mariadbd.out"
    fi
    # A private instance (own datadir, socket and port) that leaves any system MariaDB alone;
    # --no-defaults keeps /etc/mysql out of it.
    start mariadbd mariadbd --no-defaults --user=mysql --datadir="$STATE/mysql" \
        --socket="$STATE/mysql/mysqld.sock" --pid-file="$STATE/mysql/mysqld.pid" \
        --bind-address=127.0.0.1 --port="$DB_PORT" --skip-name-resolve \
        --innodb-buffer-pool-size=64M --innodb-lock-wait-timeout=900
    wait_daemon mariadbd 300 mysql_root -e 'SELECT 1' || die "mariadbd did not start: $STATE/log/mariadbd.out"
    mysql_root -e "CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY 'codl-test';
        GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1'; FLUSH PRIVILEGES;"
}

start_slurmdbd() {
    alive slurmdbd && return 0
    start slurmdbd slurmdbd -D
    wait_daemon slurmdbd 300 sacctmgr -n show cluster || die "slurmdbd did not start: $STATE/log/slurmdbd.log"
}

# Cluster, account and root's association; `sacctmgr -i add` of an existing entity is a no-op.
add_associations() {
    sacctmgr -n list cluster format=cluster | grep -qw "$CLUSTER" ||
        sacctmgr -i add cluster "$CLUSTER" >/dev/null
    sacctmgr -n list account format=account | grep -qw "$ACCOUNT" ||
        sacctmgr -i add account "$ACCOUNT" cluster="$CLUSTER" description=CoDL organization=codl \
            >/dev/null
    sacctmgr -n list assoc user=root account="$ACCOUNT" format=user | grep -qw root ||
        sacctmgr -i add user root account="$ACCOUNT" defaultaccount="$ACCOUNT" >/dev/null
}

node_state() { sinfo -h -n "$NODE" -o %T 2>/dev/null; }
node_ready() { [[ $(node_state) =~ ^(idle|mixed|allocated)$ ]]; }

start_slurm() {
    if ! alive slurmctld; then
        # Job state is kept across down/up: job IDs keep increasing, so `sacct -j ID` never
        # returns a record of an older cluster with the same ID.
        start slurmctld slurmctld -D -i
        wait_daemon slurmctld 120 scontrol ping || die "slurmctld did not start: $STATE/log/slurmctld.log"
    fi
    if ! alive slurmd; then
        start slurmd slurmd -D
    fi
    if ! wait_for 120 node_ready; then
        scontrol update nodename="$NODE" state=resume 2>/dev/null || true
        wait_for 60 node_ready ||
            die "node $NODE is '$(node_state)', not idle: $STATE/log/slurmd.log, slurmctld.log"
    fi
}

all_alive() {
    local d
    for d in $(daemons); do
        alive "$d" || return 1
    done
}

status() {
    local d rc=0
    for d in $(daemons); do
        if alive "$d"; then
            printf '%-10s running, pid %s\n' "$d" "$(pid_of "$d")"
        else
            printf '%-10s stopped\n' "$d"
            rc=1
        fi
    done
    if ((rc == 0)); then
        export_env
        printf 'node       %s is %s\n' "$NODE" "$(node_state)"
        node_ready || rc=1
        if twonode_on; then
            printf 'partition  %s: %s\n' "$TWO_PARTITION" "$(sinfo -h -p "$TWO_PARTITION" -o '%N %T' | tr '\n' ' ')"
            twonode_ready || rc=1
        elif [[ -e $STATE/twonode ]]; then
            printf 'partition  %s: off (%s)\n' "$TWO_PARTITION" "$(sed -n 2p "$STATE/twonode")"
        fi
    fi
    return $rc
}

stop_daemon() {
    local name=$1 pid
    pid=$(pid_of "$name")
    if alive "$name"; then
        kill -TERM "$pid"
        local end=$((SECONDS + 20))
        while [[ -e /proc/$pid ]] && ((SECONDS < end)); do sleep 0.2; done
        if [[ -e /proc/$pid ]]; then
            log "$name (pid $pid) ignored SIGTERM for 20 s; sending SIGKILL"
            kill -KILL "$pid" 2>/dev/null || true
        fi
    fi
    rm -f "$STATE/pid/$name.pid"
}

down() {
    local d i
    # Cancel jobs first: slurmstepd processes outlive slurmd and would keep running.
    if alive slurmctld; then
        export_env
        squeue -h -o %A | xargs -r scancel
        # shellcheck disable=SC2016 # expanded by the inner bash, on every poll
        wait_for 20 bash -c '[[ -z $(squeue -h -t running,completing -o %A) ]]' || true
    fi
    # Reverse start order: slurmds before slurmctld before slurmdbd before the database.
    for d in "${TWO_NODES[@]}"; do stop_daemon "slurmd@$d"; done
    for ((i = ${#DAEMONS[@]} - 1; i >= 0; i--)); do
        d=${DAEMONS[i]}
        stop_daemon "$d"
    done
    net_down
    rm -f "$STATE"/run/*.pid "$STATE/mysql/mysqld.sock"
    unlink_system_conf
    if [[ ${1:-} == --purge ]]; then
        rm -rf "$STATE"
    fi
}

print_usage_hint() {
    cat <<EOF
Slurm cluster '$CLUSTER' is up on node $NODE ($(sinfo -h -n "$NODE" -o '%c CPUs, %m MB'))
  source $STATE/env.sh
  partition: $PARTITION   account: $ACCOUNT
  snakemake --profile profiles/slurm ...   (after sourcing env.sh)
EOF
}

up() {
    install_packages
    install -d -m 755 "$STATE" "$STATE/etc" "$STATE/pid"
    install -d -m 755 -o slurm -g slurm "$STATE/log" "$STATE/run" "$STATE/spool" \
        "$STATE/spool/ctld"
    install -d -m 755 "$STATE/spool/d"
    export_env
    if all_alive && node_ready && { ! twonode_on || twonode_ready; }; then
        print_usage_hint
        return 0
    fi
    # A half-started cluster (a daemon died, or a config would change under a live daemon):
    # restart the Slurm daemons from fresh configuration; munged and the database may stay.
    local d
    for d in "${TWO_NODES[@]}"; do stop_daemon "slurmd@$d"; done
    for d in slurmd slurmctld slurmdbd; do stop_daemon "$d"; done
    twonode_decide
    # Before slurmctld: its address on the bridge is in slurm.conf.
    if twonode_on; then net_up; else net_down; fi
    write_configs
    start_munge
    start_mariadb
    start_slurmdbd
    add_associations
    start_slurm
    start_twonode
    print_usage_hint
}

[[ $EUID -eq 0 ]] || die "must run as root (it installs packages and starts daemons)"
case ${1:-} in
    up) up ;;
    down) down "${2:-}" ;;
    status) status ;;
    *)
        echo "usage: $0 up|down [--purge]|status" >&2
        exit 2
        ;;
esac
