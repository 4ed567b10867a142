#!/usr/bin/env bash
# scripts/multihost.sh — run an MPI program across "hosts" made of Linux network namespaces on
# this machine, over TCP only, as it would run across machines; check parity and faults.
#
#   scripts/multihost.sh run    [opts] -- PROGRAM [ARGS...]    # across --hosts namespaces
#   scripts/multihost.sh parity [opts] -- TRAIN_GPT [ARGS...]  # losses equal the threads run's
#   scripts/multihost.sh fault KIND [opts] -- PROGRAM [ARGS...]
#                        # KIND: kill | link | nostart | noroute | firewall
#   scripts/multihost.sh restart [opts] --first "MESH" --then "MESH" -- TRAIN_GPT [ARGS...]
#
#   --hosts N            namespaces ("hosts"), default 2
#   -n RANKS             processes in all, default 2 per host; rank r runs on host r / (RANKS/N)
#                        (ranks of one host adjacent, as `--map-by slot` places them)
#   --limit S            mpirun is stopped after S seconds (default 100; a hang fails, not stalls)
#   --min-bytes B        each host's link must carry at least B bytes each way (default 65536)
#   --no-forward         do not forward DTENSOR_*, OPENBLAS_* with -x (shows what happens without)
#   --no-keepalive       leave OpenMPI's TCP keepalive at its defaults (shows the hang they cause)
#   --no-attach          let the daemons detach (OpenMPI's default; shows the hang when one
#                        cannot call mpirun home)
#   --gone-within S      fault mode: every process must have ended S s after mpirun (default 10)
#   --fault-after S      fault mode: inject the fault S seconds after the launch (default 4)
#   --startup-bound S    fault mode, a host that never starts: mpirun must return within S s of
#                        the launch (default 15)
#   --expect REGEX       the job's output must match REGEX (run mode; grep -E)
#   restart mode: --first/--then MESH FLAGS, --then-hosts M, --then-n R (default 2 per host),
#                 --save-at S (3), --total T (8), --tolerance REL (1e-4)
#
# Each run builds its own network: a "switch" namespace holding a bridge, and per host a
# namespace with one veth (eth0, 10.77.0.(i+1)/24) whose peer is on the bridge. Nothing is
# created or addressed in the caller's namespace, so concurrent runs cannot collide. mpirun runs
# inside host 0; the others are reached through a launch agent (OpenMPI's plm_rsh_agent) that
# does what ssh would: `ip netns exec` into the host, a fresh environment (`env -i`: only what
# mpirun forwards with -x arrives, as over ssh) and its own hostname (a UTS namespace, so
# MPI_Get_processor_name and OpenMPI's messages name the host). Shared memory is off
# (`--mca btl tcp,self`): every byte between hosts crosses a veth, which the script checks with
# the interfaces' byte counters. Everything is torn down on exit, failure or signal: processes
# still in the namespaces are killed (and reported: a clean job leaves none), then the
# namespaces are deleted.
#
# Launcher settings recommended across machines (docs/multinode.md), all used here:
#   --mca btl tcp,self --mca btl_tcp_if_include eth0 --mca oob_tcp_if_include eth0
#   --mca oob_tcp_keepalive_time 1 --mca oob_tcp_keepalive_intvl 1 --mca oob_tcp_keepalive_probes 3
#       (mpirun and the daemons notice a lost host in seconds; by default they take minutes, and
#        mpirun hung after a host's link went down)
#   --mca orte_leave_session_attached 1 (mpirun's --leave-session-attached): each daemon stays
#       the child of its ssh instead of detaching, so a daemon that cannot call mpirun home and
#       exits ends its ssh, which mpirun sees; detached, mpirun waits for it forever (and
#       orte_startup_timeout does not end that wait in OpenMPI 4.1)
#   sysctl net.ipv4.tcp_retries2=4 on the hosts (a daemon with unacknowledged data is not
#       probed by keepalive; it retries for ~15 minutes by default and outlives the job)
#   sysctl net.ipv4.tcp_syn_retries=2 on the hosts (a daemon whose connection to mpirun is
#       silently dropped gives up after 7 s instead of 127 s)
#   -x DTENSOR_TIMEOUT_MS -x DTENSOR_CHECK_COLLECTIVES ...  (every DTENSOR_* variable set, and
#       OPENBLAS_* / OMP_NUM_THREADS, which choose the BLAS kernels and so the rounding)
#
# Fault mode (DTENSOR_TIMEOUT_MS defaults to 4000 there) runs the program, then
#   kill     kills (SIGKILL) the first rank process on the last host,
#   link     takes the last host's link down (ip link set eth0 down),
# and three hosts that never start, set up before the launch:
#   nostart  the last host's link is down: the launch agent cannot reach it (as ssh: 255),
#   noroute  the last host has no route back: its daemon starts, its call home fails at once,
#   firewall the last host's packets to host 0 are dropped (a one-way firewall: its neighbour
#            entry for h0 names a MAC no one has): its daemon starts and its call home times out,
# and requires: mpirun returns non-zero within 2 x DTENSOR_TIMEOUT_MS + 2 s of the fault (for the
# hosts that never start: within --startup-bound S, default 15, of the launch, and the output
# names the host), the output names a rank or the host, and every process in every namespace
# ends by itself within 10 s of mpirun's return. It prints
# "fault KIND: mpirun returned RC after S s ...; every process gone MS ms later".
#
# Restart mode trains --total steps with --save-every --save-at on the first mesh across --hosts,
# kills a rank on the last host once a checkpoint is saved, resumes from it on the --then mesh
# across --then-hosts (the checkpoint reshards; the namespaces share this machine's files as
# hosts share a network file system), and requires the final losses within --tolerance of a
# straight one-process (threads) run of the first mesh: the loss curve goes on.
#
# Exit status: 0 passed, 1 failed, 2 usage, 77 skipped (not root, no `ip`, no OpenMPI, or
# namespaces cannot be made here); CTest's label `multihost` (tests/multihost) runs it.
set -uo pipefail

die_usage() { echo "usage: $0 run|parity|fault KIND [--hosts N] [-n RANKS] [...] -- PROGRAM [ARGS...]" >&2; exit 2; }
skip() { echo "SKIP multihost: $*"; exit 77; }

[[ $# -ge 1 ]] || die_usage
mode="$1"; shift
fault=""
case "${mode}" in
  run|parity|restart) ;;
  fault) [[ $# -ge 1 ]] || die_usage; fault="$1"; shift
         [[ "${fault}" =~ ^(kill|link|nostart|noroute|firewall)$ ]] || { echo "$0: fault kind '${fault}' is not kill, link, nostart, noroute or firewall" >&2; exit 2; } ;;
  -h|--help) sed -n '2,/^set -uo pipefail/p' "$0" | sed '$d'; exit 0 ;;
  *) die_usage ;;
esac

hosts=2; ranks=""; limit=100; min_bytes=65536; forward=1; keepalive=1; attach=1; fault_after=4; gone_within=10; expect=""
startup_bound=15
then_hosts=""; then_ranks=""; first=""; then_mesh=""; save_at=3; total=8; tolerance=1e-4
while [[ $# -gt 0 ]]; do
  case "$1" in
    --hosts) hosts="$2"; shift 2 ;;
    -n) ranks="$2"; shift 2 ;;
    --min-bytes) min_bytes="$2"; shift 2 ;;
    --limit) limit="$2"; shift 2 ;;
    --no-forward) forward=0; shift ;;
    --no-keepalive) keepalive=0; shift ;;
    --no-attach) attach=0; shift ;;
    --startup-bound) startup_bound="$2"; shift 2 ;;
    --fault-after) fault_after="$2"; shift 2 ;;
    --gone-within) gone_within="$2"; shift 2 ;;
    --expect) expect="$2"; shift 2 ;;
    --then-hosts) then_hosts="$2"; shift 2 ;;
    --then-n) then_ranks="$2"; shift 2 ;;
    --first) first="$2"; shift 2 ;;
    --then) then_mesh="$2"; shift 2 ;;
    --save-at) save_at="$2"; shift 2 ;;
    --total) total="$2"; shift 2 ;;
    --tolerance) tolerance="$2"; shift 2 ;;
    --) shift; break ;;
    *) echo "$0: unknown option '$1' (the program goes after --)" >&2; exit 2 ;;
  esac
done
[[ $# -ge 1 ]] || die_usage
[[ "${hosts}" =~ ^[0-9]+$ && ${hosts} -ge 2 && ${hosts} -le 32 ]] || { echo "$0: --hosts ${hosts}: want 2..32" >&2; exit 2; }
ranks="${ranks:-$((2 * hosts))}"
[[ "${ranks}" =~ ^[0-9]+$ && $((ranks % hosts)) -eq 0 && ${ranks} -ge ${hosts} ]] ||
  { echo "$0: -n ${ranks} is not a positive multiple of --hosts ${hosts}" >&2; exit 2; }
per_host=$((ranks / hosts))
then_hosts="${then_hosts:-${hosts}}"; then_ranks="${then_ranks:-$((2 * then_hosts))}"
[[ "${then_hosts}" =~ ^[0-9]+$ && ${then_hosts} -ge 1 && $((then_ranks % then_hosts)) -eq 0 ]] ||
  { echo "$0: --then-n ${then_ranks} is not a multiple of --then-hosts ${then_hosts}" >&2; exit 2; }
nets=$(( hosts > then_hosts ? hosts : then_hosts ))  # namespaces to make
prog=("$@")
[[ -x "${prog[0]}" ]] || { echo "$0: ${prog[0]} is not an executable (build it first)" >&2; exit 2; }
prog[0]="$(cd "$(dirname "${prog[0]}")" && pwd)/$(basename "${prog[0]}")"

# Faults are found by the timeout: a short one, so that the bound below is seconds.
[[ "${mode}" == "fault" || "${mode}" == "restart" ]] && export DTENSOR_TIMEOUT_MS="${DTENSOR_TIMEOUT_MS:-4000}"

# ---- can this machine do it? ----
[[ "$(id -u)" -eq 0 ]] || skip "needs root to create network namespaces (run as root, or in CI)"
command -v ip >/dev/null || skip "no 'ip' command (iproute2)"
command -v unshare >/dev/null || skip "no 'unshare' command (util-linux)"
command -v mpirun >/dev/null || skip "no mpirun"
[[ "$(mpirun --version 2>/dev/null)" == *"Open MPI"* ]] || skip "the launch agent is OpenMPI's (plm_rsh_agent); mpirun is not OpenMPI"

# Namespaces left by an earlier run of this script that was killed outright (SIGKILL skips its
# trap): their names carry the pid of a run that no longer exists.
for n in $(ip netns list 2>/dev/null | grep -oE '^dtmh[0-9]+-[a-z0-9]+'); do
  pid="${n#dtmh}"; pid="${pid%%-*}"
  if [[ ! -d /proc/${pid} ]]; then
    for p in $(ip netns pids "${n}" 2>/dev/null); do kill -9 "${p}" 2>/dev/null; done
    ip netns delete "${n}" 2>/dev/null && rm -rf "/etc/netns/${n}" && echo "== removed ${n}, left by a killed run"
  fi
done

tag="dtmh$$"
work="$(mktemp -d "/tmp/${tag}.XXXX")"
sw="${tag}-sw"
ns() { echo "${tag}-h$1"; }
made=()  # namespaces created, for the teardown

# Kills what is still running in our namespaces (only processes in namespaces this run made),
# then deletes them. Runs on every exit.
teardown() {
  local n p left
  for n in "${made[@]}"; do
    left="$(ip netns pids "${n}" 2>/dev/null | tr '\n' ' ')"
    for p in ${left}; do kill -9 "${p}" 2>/dev/null; done
  done
  for n in "${made[@]}"; do ip netns delete "${n}" 2>/dev/null; done
  rm -rf "${work}"
}
trap teardown EXIT
# Jobs run in the background and are waited for, so that a signal reaches this trap at once
# (bash defers traps while a foreground child runs); the EXIT trap then cleans up.
job=""
trap 'echo "multihost: interrupted" >&2; [[ -n "${job}" ]] && kill "${job}" 2>/dev/null; exit 130' INT TERM HUP

mkns() {
  ip netns add "$1" 2>"${work}/err" || { cat "${work}/err" >&2; return 1; }
  made+=("$1")
  ip -n "$1" link set lo up
}
mkns "${sw}" || skip "cannot create a network namespace here (ip netns add: $(cat "${work}/err"))"
ip -n "${sw}" link add br0 type bridge && ip -n "${sw}" link set br0 up || { echo "multihost: cannot make a bridge" >&2; exit 1; }
for ((h = 0; h < nets; ++h)); do
  mkns "$(ns ${h})" || exit 1
  # The veth is made inside the host's namespace, its peer inside the switch's: nothing in ours.
  ip -n "$(ns ${h})" link add eth0 type veth peer name p${h} netns "${sw}" || exit 1
  ip -n "${sw}" link set p${h} master br0 && ip -n "${sw}" link set p${h} up || exit 1
  ip -n "$(ns ${h})" addr add "10.77.0.$((h + 1))/24" dev eth0 && ip -n "$(ns ${h})" link set eth0 up || exit 1
  # A connection with unacknowledged data is not probed by keepalive: TCP retransmits it for
  # tcp_retries2 tries (default 15: about 15 minutes) before the socket fails. A daemon that was
  # sending when its link went down then outlived the job (1 run in 6). 4 tries: about 6 s.
  ip netns exec "$(ns ${h})" sysctl -qw net.ipv4.tcp_retries2=4 || exit 1
  # A connection whose SYNs go unanswered (a firewall that drops) is retried tcp_syn_retries
  # times, 1 + 2 + 4 + ... s apart: 6 by default, 127 s. A daemon that cannot call mpirun home
  # keeps trying that long before it fails. 2 tries: it fails after 7 s.
  ip netns exec "$(ns ${h})" sysctl -qw net.ipv4.tcp_syn_retries=2 || exit 1
done

# The launch agent: OpenMPI calls `agent HOST COMMAND...` as it would call ssh.
cat >"${work}/agent" <<EOF
#!/bin/sh
# multihost.sh's launch agent: into host \$1's namespace, with a fresh environment, as ssh would.
host="\$1"; shift
# As ssh: a host whose link is down cannot be reached (ssh exits 255).
if ! ip -n "${tag}-\${host}" link show eth0 2>/dev/null | grep -q 'state UP'; then
  echo "multihost agent: connect to host \${host}: No route to host (its link is down)" >&2; exit 255
fi
exec ip netns exec "${tag}-\${host}" env -i PATH="${PATH}" HOME="\${HOME:-/root}" \\
  unshare --uts sh -c "hostname \${host} && exec \$*"
EOF
chmod +x "${work}/agent"
for ((h = 0; h < hosts; ++h)); do echo "h${h} slots=${per_host}"; done >"${work}/hostfile"
# Host names resolve inside every namespace (ip netns exec binds /etc/netns/NS/hosts).
[[ -d /etc/netns ]] && etc_netns_was_there=1 || etc_netns_was_there=0
teardown_etc() {
  for ((h = 0; h < nets; ++h)); do rm -rf "/etc/netns/$(ns ${h})"; done
  [[ ${etc_netns_was_there} -eq 1 ]] || rmdir /etc/netns 2>/dev/null
}
trap 'teardown_etc; teardown' EXIT
for ((h = 0; h < nets; ++h)); do
  mkdir -p "/etc/netns/$(ns ${h})"
  { echo "127.0.0.1 localhost"; for ((k = 0; k < nets; ++k)); do echo "10.77.0.$((k + 1)) h${k}"; done; } \
    >"/etc/netns/$(ns ${h})/hosts"
done

# ---- the mpirun command ----
forwarded=()
if [[ ${forward} -eq 1 ]]; then
  # DTENSOR_* (the library's settings) and what picks the BLAS kernels: OpenBLAS chooses its
  # kernels by CPU unless OPENBLAS_CORETYPE names them, and ranks on different kernels sum in
  # different orders (the losses then differ from the threads run's in the 9th digit).
  for v in $(compgen -e | grep -E '^(DTENSOR_|OPENBLAS_|OMP_NUM_THREADS$)' || true); do forwarded+=(-x "${v}"); done
fi
mca=(--mca plm_rsh_agent "${work}/agent" --mca plm_rsh_no_tree_spawn 1
     --mca btl tcp,self --mca btl_tcp_if_include eth0 --mca oob_tcp_if_include eth0
     --mca mpi_yield_when_idle 1 --mca btl_base_warn_component_unused 0)
if [[ ${keepalive} -eq 1 ]]; then
  mca+=(--mca oob_tcp_keepalive_time 1 --mca oob_tcp_keepalive_intvl 1 --mca oob_tcp_keepalive_probes 3)
fi
# A daemon that starts but cannot reach mpirun exits; attached, its exit ends the agent (ssh)
# that mpirun waits on, which then reports the host. Detached (--daemonize, the default), mpirun
# only waits for a call home that never comes.
[[ ${attach} -eq 1 ]] && mca+=(--mca orte_leave_session_attached 1)
# launch_on HOSTFILE RANKS ARGS...: sets `launch`, the mpirun command line.
launch_on() {
  local hf="$1" n="$2"; shift 2
  launch=(mpirun --allow-run-as-root --oversubscribe --hostfile "${hf}" -n "${n}" --map-by slot
          "${mca[@]}" "${forwarded[@]}" "$@")
}
launch_on "${work}/hostfile" "${ranks}" "${prog[@]}"

# Runs `launch` inside host 0 (as host h0), output to $1; returns mpirun's status.
# Never longer than --limit seconds (default 100, below CTest's 120): CTest kills a test that
# runs past its TIMEOUT outright, and the trap would not run.
run_job() {
  ip netns exec "$(ns 0)" unshare --uts sh -c 'hostname h0 && exec "$@"' sh \
    timeout -k 5 "${limit}" "${launch[@]}" >"$1" 2>&1
}
link_bytes() {  # "rx tx" of host $1's eth0
  ip netns exec "$(ns $1)" sh -c 'cat /sys/class/net/eth0/statistics/rx_bytes /sys/class/net/eth0/statistics/tx_bytes' | tr '\n' ' '
}
left_running() {  # processes still in any host namespace
  local h out=""
  for ((h = 0; h < nets; ++h)); do
    local p; p="$(ip netns pids "$(ns ${h})" 2>/dev/null | tr '\n' ' ')"
    for pid in ${p}; do out+=" h${h}:${pid}($(cat /proc/${pid}/comm 2>/dev/null))"; done
  done
  echo "${out}"
}

echo "== ${hosts} hosts x ${per_host} ranks over TCP (btl tcp,self); ${forwarded[*]:-no DTENSOR_* forwarded}"
echo "== ${launch[*]}"

if [[ "${mode}" == "restart" ]]; then
  [[ -n "${first}" && -n "${then_mesh}" ]] || { echo "$0: restart needs --first MESH and --then MESH" >&2; exit 2; }
  ckpt="${work}/ckpt"
  # shellcheck disable=SC2086  # the mesh flags are words
  launch_on "${work}/hostfile" "${ranks}" "${prog[@]}" ${first} --steps "${total}" --save-every "${save_at}" --save-dir "${ckpt}"
  echo "== 1. ${hosts} hosts: ${first}, --save-every ${save_at}; a rank on h$((hosts - 1)) killed after the first checkpoint"
  run_job "${work}/first" & job=$!
  deadline=$(( $(date +%s) + 120 ))
  until grep -aq "checkpoint saved to ${ckpt}" "${work}/first" 2>/dev/null; do
    kill -0 "${job}" 2>/dev/null && [[ $(date +%s) -lt ${deadline} ]] ||
      { tr '\r' '\n' <"${work}/first" | tail -20; echo "FAIL: no checkpoint saved before the job ended"; exit 1; }
    sleep 0.1
  done
  for p in $(ip netns pids "$(ns $((hosts - 1)))"); do
    [[ "$(cat /proc/${p}/comm 2>/dev/null)" == "$(basename "${prog[0]}" | cut -c1-15)" ]] && { kill -9 "${p}"; break; }
  done
  wait "${job}"; rc=$?
  tr '\r' '\n' <"${work}/first" | grep -aE "checkpoint saved|mpirun noticed" | sed 's/^/  | /'
  [[ ${rc} -ne 0 ]] || { echo "FAIL: the first run ended normally: it was not killed (raise --total)"; exit 1; }
  then_per_host=$((then_ranks / then_hosts))
  for ((h = 0; h < then_hosts; ++h)); do echo "h${h} slots=${then_per_host}"; done >"${work}/hostfile2"
  # shellcheck disable=SC2086
  launch_on "${work}/hostfile2" "${then_ranks}" "${prog[@]}" ${then_mesh} --steps "${total}" --resume "${ckpt}"
  echo "== 2. ${then_hosts} hosts: ${then_mesh}, --resume"
  run_job "${work}/then" & job=$!; wait "${job}"; rc=$?
  tr '\r' '\n' <"${work}/then" | grep -aE "resumed from|final losses|mesh" | sed 's/^/  | /'
  [[ ${rc} -eq 0 ]] || { tr '\r' '\n' <"${work}/then" | tail -20; echo "FAIL: the resumed run failed (${rc})"; exit 1; }
  at="$(grep -aoE "resumed from ${ckpt} at step [0-9]+" "${work}/then" | grep -oE '[0-9]+$')"
  [[ -n "${at}" && ${at} -ge ${save_at} && ${at} -lt ${total} ]] || { echo "FAIL: not resumed from a step in [${save_at}, ${total})"; exit 1; }
  threads=("${prog[@]}")
  for ((i = 1; i < ${#threads[@]}; ++i)); do [[ "${threads[i]}" == "--backend" ]] && threads[i + 1]=threads; done
  # shellcheck disable=SC2086
  "${threads[@]}" ${first} --steps "${total}" >"${work}/ref" 2>&1 || { tail -5 "${work}/ref"; echo "FAIL: the threads reference failed"; exit 1; }
  final() { grep -aoE 'final losses at step [0-9]+: train [^ ]+ validation [^ ]+' "$1"; }
  want="$(final "${work}/ref")"; got="$(final "${work}/then")"
  echo "   straight (threads, first mesh): ${want}"
  echo "   killed at step >= ${at}, resumed on ${then_hosts} hosts: ${got}"
  awk -v a="${want}" -v b="${got}" -v tol="${tolerance}" 'BEGIN {
    n = split(a, x, " "); m = split(b, y, " "); if (n != m || n < 9) { print "FAIL: no final losses"; exit 1 }
    for (i = 7; i <= n; i += 2) { d = x[i] - y[i]; if (d < 0) d = -d; s = x[i] < 0 ? -x[i] : x[i];
      if (d > tol * s) { print "FAIL: " x[i] " vs " y[i] " beyond relative " tol; exit 1 } } }' || exit 1
  echo "PASS restart: killed on ${hosts} hosts, resumed on ${then_hosts} from step ${at}, losses within ${tolerance}"
  exit 0
fi

if [[ "${mode}" == "fault" ]]; then
  last=$((hosts - 1))
  bound_ms=$((2 * DTENSOR_TIMEOUT_MS + 2000)); bound_what="2 x DTENSOR_TIMEOUT_MS + 2 s"
  startup=0
  if [[ "${fault}" =~ ^(nostart|noroute|firewall)$ ]]; then
    startup=1; bound_ms=$((startup_bound * 1000)); bound_what="--startup-bound, from the launch"
  fi
  case "${fault}" in
    nostart) ip -n "$(ns ${last})" link set eth0 down ;;
    noroute) ip -n "$(ns ${last})" route del 10.77.0.0/24 dev eth0 ;;
    firewall) ip -n "$(ns ${last})" neigh replace 10.77.0.1 lladdr 02:00:00:00:00:77 dev eth0 nud permanent ;;
  esac
  t0=$(date +%s%N)
  run_job "${work}/out" & job=$!
  if [[ ${startup} -eq 0 ]]; then
    sleep "${fault_after}"
    if ! kill -0 "${job}" 2>/dev/null; then cat "${work}/out"; echo "FAIL: the job ended before the fault was injected (raise --fault-after or the steps)"; exit 1; fi
    case "${fault}" in
      kill)
        victim=""
        for p in $(ip netns pids "$(ns ${last})"); do
          [[ "$(cat /proc/${p}/comm 2>/dev/null)" == "$(basename "${prog[0]}" | cut -c1-15)" ]] && { victim=${p}; break; }
        done
        [[ -n "${victim}" ]] || { cat "${work}/out"; echo "FAIL: no rank process found on h${last}"; exit 1; }
        echo "== fault: kill -9 ${victim} (a rank on h${last})"; kill -9 "${victim}" ;;
      link) echo "== fault: ip link set eth0 down on h${last}"; ip -n "$(ns ${last})" link set eth0 down ;;
    esac
    t0=$(date +%s%N)
  fi
  # Wait for mpirun, but never past the bound plus a margin: a hang is a failure, not a stall.
  deadline=$(( $(date +%s) + bound_ms / 1000 + 30 ))
  while kill -0 "${job}" 2>/dev/null && [[ $(date +%s) -lt ${deadline} ]]; do sleep 0.2; done
  if kill -0 "${job}" 2>/dev/null; then
    cat "${work}/out"; echo "FAIL: mpirun still running $((bound_ms / 1000 + 30)) s after the fault (hung)"; exit 1
  fi
  wait "${job}"; rc=$?
  ms=$(( ($(date +%s%N) - t0) / 1000000 ))
  # The progress bar's carriage returns make one long line: the last screenful of messages.
  tr '\r' '\n' <"${work}/out" | grep -v '^\[[#.]*\]' | sed 's/^/  | /' | tail -40
  # Every process on every host (a lost host's daemon and ranks too) must end by itself within
  # 10 s of mpirun's return; the teardown would kill them, but that is not what a cluster has.
  left="$(left_running)"; gone_ms=0
  while [[ -n "${left}" && ${gone_ms} -lt $((gone_within * 1000)) ]]; do sleep 0.2; gone_ms=$((gone_ms + 200)); left="$(left_running)"; done
  printf 'fault %s: mpirun returned %d after %d.%01d s (bound %d ms = %s); %s\n' \
    "${fault}" "${rc}" $((ms / 1000)) $((ms % 1000 / 100)) "${bound_ms}" "${bound_what}" \
    "$([[ -z "${left}" ]] && echo "every process gone ${gone_ms} ms later" || echo "left running ${gone_within} s later:${left}")"
  fail=0
  [[ ${rc} -ne 0 ]] || { echo "FAIL: mpirun returned 0 after a fault"; fail=1; }
  [[ ${ms} -le ${bound_ms} ]] || { echo "FAIL: ${ms} ms > bound ${bound_ms} ms"; fail=1; }
  [[ -z "${left}" ]] || { echo "FAIL: processes left running after mpirun returned:${left}"; fail=1; }
  grep -Eq "rank [0-9]+|h${last}|10\.77\.0\.${hosts}" "${work}/out" || { echo "FAIL: no message names a rank or host h${last}"; fail=1; }
  # A host that never started has no rank: the message must name the host.
  [[ ${startup} -eq 0 ]] || grep -Eq "(host|node):? +h${last}\b" "${work}/out" || { echo "FAIL: no message names host h${last}"; fail=1; }
  [[ ${fail} -eq 0 ]] && echo "PASS fault ${fault}"
  exit ${fail}
fi

# ---- run / parity ----
declare -A before
for ((h = 0; h < hosts; ++h)); do before[${h}]="$(link_bytes ${h})"; done
t0=$(date +%s%N)
run_job "${work}/out" & job=$!; wait "${job}"; rc=$?
ms=$(( ($(date +%s%N) - t0) / 1000000 ))
cat "${work}/out"
fail=0
[[ ${rc} -eq 0 ]] || { echo "FAIL: mpirun returned ${rc}"; fail=1; }
echo "== bytes over each host's link (rx / tx) in $((ms / 1000)).$((ms % 1000 / 100)) s:"
for ((h = 0; h < hosts; ++h)); do
  read -r rx0 tx0 <<<"${before[${h}]}"; read -r rx1 tx1 <<<"$(link_bytes ${h})"
  rx=$((rx1 - rx0)); tx=$((tx1 - tx0))
  echo "   h${h}: ${rx} / ${tx}"
  if [[ ${rx} -lt ${min_bytes} || ${tx} -lt ${min_bytes} ]]; then
    echo "FAIL: h${h}'s link carried less than ${min_bytes} bytes each way: the job did not cross hosts"; fail=1
  fi
done
if [[ -n "${expect}" ]] && ! grep -Eq "${expect}" "${work}/out"; then echo "FAIL: the output does not match '${expect}'"; fail=1; fi
left="$(left_running)"
[[ -z "${left}" ]] || { echo "FAIL: processes left running after mpirun returned:${left}"; fail=1; }

if [[ "${mode}" == "parity" && ${fail} -eq 0 ]]; then
  # The same training on one process (threads backend): every step's loss, printed to all
  # digits, must be equal.
  threads=("${prog[@]}")
  for ((i = 1; i < ${#threads[@]}; ++i)); do
    [[ "${threads[i]}" == "--backend" ]] && threads[i + 1]=threads
  done
  "${threads[@]}" >"${work}/ref" 2>&1 || { cat "${work}/ref"; echo "FAIL: the threads reference run failed"; exit 1; }
  losses() { grep -E '^final losses at step' "$1"; }
  if [[ -z "$(losses "${work}/out")" ]]; then echo "FAIL: no 'final losses' line in the multihost run"; fail=1
  elif [[ "$(losses "${work}/out")" != "$(losses "${work}/ref")" ]]; then
    echo "FAIL: losses differ"; echo "  threads:   $(losses "${work}/ref")"; echo "  ${hosts} hosts: $(losses "${work}/out")"; fail=1
  else
    echo "== parity: ${hosts} hosts == threads: $(losses "${work}/out")"
  fi
fi
[[ ${fail} -eq 0 ]] && echo "PASS ${mode} across ${hosts} hosts"
exit ${fail}
