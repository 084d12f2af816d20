#!/usr/bin/env bash
# A cluster of "nodes" on one machine: N network namespaces, each joined by a veth pair to one
# bridge in the root namespace, so MPI between them goes over TCP through real links that `tc`
# can shape (rate, added delay, loss). SLOPE_NETNS_MTU sets every link's MTU (default 1500). The root namespace has an address on the bridge too:
# mpirun and its PMIx server run there and the ranks inside the namespaces reach them over it.
#
#   scripts/netns-cluster.sh up N          make nodes 0..N-1 (idempotent: what exists is kept)
#   scripts/netns-cluster.sh down          remove every node, veth and the bridge (idempotent)
#   scripts/netns-cluster.sh shape NODE|all [--rate R] [--delay D] [--loss L]
#                                          shape both directions of a node's link, e.g.
#                                          --rate 10gbit (tc tbf); --delay 1ms --loss 0.1%
#                                          use the kernel's netem, or where it is absent
#                                          scripts/netns-link.py (the link becomes two TAP
#                                          devices and a user-space forwarder)
#   scripts/netns-cluster.sh unshape NODE|all
#   scripts/netns-cluster.sh status        the nodes, their addresses, qdiscs and byte counters
#   scripts/netns-cluster.sh bytes NODE    "tx rx" bytes of the node's link (its root side)
#   scripts/netns-cluster.sh mpirun RANKS_PER_NODE -- CMD ARGS...
#                                          run CMD on every node under one mpirun (MPMD, one
#                                          app context per node), MPI over TCP on the bridge only
#   scripts/netns-cluster.sh with N -- CMD ARGS...
#                                          up N, run CMD, and take everything down when CMD
#                                          ends, fails or is interrupted
#
# Names (override with the environment): SLOPE_NETNS_PREFIX (default slope-n: namespaces
# slope-n0, slope-n1, ...), SLOPE_NETNS_BRIDGE (slope-br0), SLOPE_NETNS_SUBNET (10.77.0: node i
# is .(i+1), the root namespace .254, a /24).
#
# Exit status 77 when the machine cannot do it (no `ip`, or no CAP_NET_ADMIN / CAP_SYS_ADMIN),
# so tests can skip; 2 on a usage error; 1 when a step fails.
set -euo pipefail

prefix="${SLOPE_NETNS_PREFIX:-slope-n}"
bridge="${SLOPE_NETNS_BRIDGE:-slope-br0}"
subnet="${SLOPE_NETNS_SUBNET:-10.77.0}"
root_addr="$subnet.254"
veth_prefix="${prefix//-/}v"   # root side of node i's link: e.g. slopenv0 (names <= 15 chars)
mtu="${SLOPE_NETNS_MTU:-1500}"
run_dir="${SLOPE_NETNS_RUN:-/run/slope-netns}"   # pid files of the user-space links
here="$(cd "$(dirname "$0")" && pwd)"

die() { echo "netns-cluster: $*" >&2; exit 1; }
usage() { sed -n '2,28p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }

# The capabilities a namespace, a veth and a qdisc need; checked up front so the error says
# what is missing instead of a bare "Operation not permitted" halfway through.
require_net_admin() {
  if ! command -v ip > /dev/null; then
    echo "netns-cluster: 'ip' (iproute2) is not installed: apt-get install iproute2" >&2
    exit 77
  fi
  local cap
  cap=$(awk '/^CapEff:/ {print $2}' /proc/self/status)
  # CAP_NET_ADMIN is bit 12, CAP_SYS_ADMIN (for `ip netns add`'s mount namespace work) bit 21.
  if (( (16#$cap >> 12 & 1) == 0 || (16#$cap >> 21 & 1) == 0 )); then
    echo "netns-cluster: needs CAP_NET_ADMIN and CAP_SYS_ADMIN (run as root, or in a container" \
         "started with --cap-add NET_ADMIN --cap-add SYS_ADMIN); effective caps are 0x$cap" >&2
    exit 77
  fi
  # Capabilities are not enough everywhere (a chroot without /run, some containers): try one.
  local probe="slope-probe-$$" err
  if ! err=$(ip netns add "$probe" 2>&1); then
    echo "netns-cluster: this machine cannot make network namespaces ('ip netns add' said: $err)" >&2
    exit 77
  fi
  # Entering one (ip netns exec, ip -n) also needs a private mount namespace, which a chroot
  # refuses ("mount --make-rslave /" failed) even where adding one works.
  if ! err=$(ip netns exec "$probe" true 2>&1); then
    ip netns del "$probe" 2>/dev/null || true
    echo "netns-cluster: this machine cannot enter network namespaces ('ip netns exec' said: $err)" >&2
    exit 77
  fi
  ip netns del "$probe" 2>/dev/null || true
}

ns_name() { echo "$prefix$1"; }
veth_name() { echo "$veth_prefix$1"; }
nodes() {  # indices of the nodes that exist, ascending
  ip netns list 2>/dev/null | awk '{print $1}' | sed -n "s/^${prefix}\([0-9][0-9]*\)$/\1/p" | sort -n
}
node_exists() { ip netns list 2>/dev/null | awk '{print $1}' | grep -qx "$(ns_name "$1")"; }

check_node_index() {
  [[ "$1" =~ ^[0-9]+$ ]] || die "node '$1' is not a number (nodes are 0..N-1; see 'status')"
  node_exists "$1" || die "node $1 does not exist (make it with 'up N'; see 'status')"
}

cmd_up() {
  local n="${1:-}"
  [[ "$n" =~ ^[0-9]+$ ]] && (( n >= 1 && n <= 200 )) || die "up needs a node count 1..200, got '${n}'"
  require_net_admin
  # A step failing halfway leaves nothing behind.
  trap 'echo "netns-cluster: up failed; removing what it made" >&2; cmd_down' ERR
  if ! ip link show "$bridge" > /dev/null 2>&1; then
    ip link add "$bridge" type bridge
  fi
  ip addr replace "$root_addr/24" dev "$bridge"
  ip link set "$bridge" up
  # Bridged frames must not go through the root namespace's iptables (a container's FORWARD
  # policy could drop them); absent br_netfilter, the knob does not exist and nothing filters.
  if [[ -w /proc/sys/net/bridge/bridge-nf-call-iptables ]]; then
    echo 0 > /proc/sys/net/bridge/bridge-nf-call-iptables || true
  fi
  local i ns veth
  for ((i = 0; i < n; i++)); do
    ns=$(ns_name "$i"); veth=$(veth_name "$i")
    node_exists "$i" || ip netns add "$ns"
    make_veth "$i"
  done
  trap - ERR
  # Every node's link is up at both ends (and answers a ping, where ping is installed) before
  # anyone relies on it.
  local tries
  for ((i = 0; i < n; i++)); do
    veth=$(veth_name "$i")
    for ((tries = 0; tries < 40; tries++)); do
      [[ "$(cat "/sys/class/net/$veth/operstate")" == up ]] && break
      sleep 0.05
    done
    [[ "$(cat "/sys/class/net/$veth/operstate")" == up ]] \
      || die "node $i's link $veth did not come up (operstate $(cat "/sys/class/net/$veth/operstate"))"
    if command -v ping > /dev/null; then
      ping -c 1 -W 2 "$subnet.$((i + 1))" > /dev/null 2>&1 \
        || die "node $i ($subnet.$((i + 1))) does not answer a ping on $bridge"
    fi
  done
  echo "netns-cluster: $n node(s) up on $bridge ($subnet.0/24; root namespace $root_addr)"
}

# Node i's link as a veth pair (what `up` makes, and what `unshape` restores after an emulated
# link), mtu $mtu, the node's address on eth0.
make_veth() {
  local i="$1" ns veth
  ns=$(ns_name "$i"); veth=$(veth_name "$i")
  if ! ip link show "$veth" > /dev/null 2>&1; then
    ip netns exec "$ns" ip link del eth0 2> /dev/null || true
    ip link add "$veth" mtu "$mtu" type veth peer name eth0 netns "$ns"
  fi
  ip -n "$ns" link set eth0 mtu "$mtu"
  ip link set "$veth" mtu "$mtu"
  ip link set "$veth" master "$bridge"
  ip link set "$veth" up
  ip -n "$ns" addr replace "$subnet.$((i + 1))/24" dev eth0
  ip -n "$ns" link set eth0 up
  ip -n "$ns" link set lo up
}

# The user-space link of node i (scripts/netns-link.py), if one runs: stop it (it removes its
# TAP devices) and wait for it.
stop_emulated_link() {
  local pidfile="$run_dir/$(ns_name "$1").pid" pid
  [[ -f "$pidfile" ]] || return 0
  pid=$(cat "$pidfile")
  if kill -TERM "$pid" 2> /dev/null; then
    local tries
    for ((tries = 0; tries < 100; tries++)); do
      kill -0 "$pid" 2> /dev/null || break
      sleep 0.05
    done
    kill -KILL "$pid" 2> /dev/null || true
  fi
  rm -f "$pidfile" "$run_dir/$(ns_name "$1")".{ready,stats}
  ip link del "$(veth_name "$1")" 2> /dev/null || true
  ip link del "$(veth_name "$1")n" 2> /dev/null || true
}

# Node i's link replaced by two TAP devices joined by scripts/netns-link.py, which adds the
# delay and the loss in user space (for kernels without netem). Same names and address, so
# `bytes`, `status` and `mpirun` see no difference.
start_emulated_link() {
  local i="$1" delay_ms="$2" loss_pct="$3" ns pidfile ready
  ns=$(ns_name "$i"); pidfile="$run_dir/$ns.pid"; ready="$run_dir/$ns.ready"
  command -v python3 > /dev/null || die "--delay/--loss without netem need python3 (scripts/netns-link.py)"
  stop_emulated_link "$i"
  ip link del "$(veth_name "$i")" 2> /dev/null || true
  mkdir -p "$run_dir"; rm -f "$ready"
  python3 "$here/netns-link.py" --namespace "$ns" --port "$(veth_name "$i")" --bridge "$bridge" \
    --address "$subnet.$((i + 1))/24" --mtu "$mtu" --delay-ms "$delay_ms" --loss-pct "$loss_pct" \
    --seed "$((i + 1))" --ready "$ready" --stats "$run_dir/$ns.stats" > "$run_dir/$ns.log" 2>&1 &
  echo $! > "$pidfile"
  local tries
  for ((tries = 0; tries < 100; tries++)); do
    [[ -f "$ready" ]] && return 0
    kill -0 "$(cat "$pidfile")" 2> /dev/null || break
    sleep 0.05
  done
  die "node $i's emulated link did not start: $(tail -3 "$run_dir/$ns.log")"
}

duration_ms() {  # "1ms" | "500us" | "0.2s" -> milliseconds
  [[ "$1" =~ ^([0-9]+(\.[0-9]+)?)(us|ms|s)$ ]] || die "delay '$1' is NUMBER followed by us, ms or s (e.g. 1ms)"
  python3 -c "import sys; v, u = float(sys.argv[1]), sys.argv[2]; print(v / 1000 if u == 'us' else v * 1000 if u == 's' else v)" \
    "${BASH_REMATCH[1]}" "${BASH_REMATCH[3]}"
}
loss_pct() {  # "0.1%" -> 0.1
  [[ "$1" =~ ^([0-9]+(\.[0-9]+)?)%$ ]] || die "loss '$1' is a percentage (e.g. 0.1%)"
  echo "${BASH_REMATCH[1]}"
}

cmd_down() {
  command -v ip > /dev/null || exit 0
  local i
  for i in $(nodes); do
    stop_emulated_link "$i"
    ip link del "$(veth_name "$i")" 2> /dev/null || true   # takes the peer with it
    ip netns del "$(ns_name "$i")" 2> /dev/null || true
  done
  ip link del "$bridge" 2> /dev/null || true
}

# Both ends of a node's link are shaped: the root side shapes what the node receives, the node's
# eth0 what it sends. A rate alone is a token bucket (tbf), whose bucket holds 1 ms of the rate
# (at least 256 KiB, several 64 KiB GSO frames) so the rate, not the bucket, sets the
# throughput. A delay or a loss is netem's (rate included) where the kernel has it
# (CONFIG_NET_SCH_NETEM); elsewhere the link becomes an emulated one (start_emulated_link) and
# its rate is tbf on the TAP devices. The emulated link forwards frames in Python: about
# 1 Gbit/s at most with SLOPE_NETNS_MTU=9000, half that at 1500 (measured with 1 ms added).
rate_bits() {  # "10gbit" -> 10000000000
  local v="$1" num unit
  [[ "$v" =~ ^([0-9]+)(bit|kbit|mbit|gbit)$ ]] \
    || die "rate '$v' is not NUMBER followed by bit, kbit, mbit or gbit (e.g. 10gbit)"
  num=${BASH_REMATCH[1]}; unit=${BASH_REMATCH[2]}
  case "$unit" in
    bit) echo "$num" ;; kbit) echo $((num * 1000)) ;;
    mbit) echo $((num * 1000000)) ;; gbit) echo $((num * 1000000000)) ;;
  esac
}

has_netem() {
  tc qdisc add dev "$bridge" root netem delay 0ms 2> /dev/null || return 1
  tc qdisc del dev "$bridge" root 2> /dev/null || true
}

cmd_shape() {
  local target="${1:-}"; shift || true
  [[ -n "$target" ]] || die "shape needs NODE or all"
  local rate="" delay="" loss=""
  while (( $# )); do
    case "$1" in
      --rate) rate="${2:?--rate needs a value such as 10gbit}"; shift 2 ;;
      --delay) delay="${2:?--delay needs a value such as 1ms}"; shift 2 ;;
      --loss) loss="${2:?--loss needs a value such as 0.1%}"; shift 2 ;;
      *) die "shape: unknown option '$1' (--rate R, --delay D, --loss L)" ;;
    esac
  done
  [[ -n "$rate$delay$loss" ]] || die "shape needs at least one of --rate, --delay, --loss"
  require_net_admin
  local list; list=$(targets "$target")
  local args=() i
  if [[ -n "$delay$loss" ]] && has_netem; then
    args=(netem limit 100000)
    [[ -n "$delay" ]] && args+=(delay "$delay")
    [[ -n "$loss" ]] && args+=(loss "$loss")
    [[ -n "$rate" ]] && args+=(rate "$rate")
  else
    if [[ -n "$delay$loss" ]]; then
      local dms=0 lpct=0
      [[ -n "$delay" ]] && dms=$(duration_ms "$delay")
      [[ -n "$loss" ]] && lpct=$(loss_pct "$loss")
      if [[ -n "$rate" ]] && (( $(rate_bits "$rate") > 1000000000 )); then
        echo "netns-cluster: no netem here, so the delay and loss are added in user space, which" \
             "forwards about 1 Gbit/s at most (with SLOPE_NETNS_MTU=9000): $rate will not be reached" >&2
      fi
      for i in $list; do start_emulated_link "$i" "$dms" "$lpct"; done
    fi
    if [[ -n "$rate" ]]; then
      local bits burst
      bits=$(rate_bits "$rate")
      burst=$(( bits / 8 / 1000 ))
      (( burst >= 262144 )) || burst=262144
      args=(tbf rate "$rate" burst "$burst" latency 50ms)
    fi
  fi
  (( ${#args[@]} )) || return 0
  for i in $list; do
    tc qdisc replace dev "$(veth_name "$i")" root "${args[@]}" \
      || die "tc qdisc ${args[*]} refused on $(veth_name "$i")"
    ip netns exec "$(ns_name "$i")" tc qdisc replace dev eth0 root "${args[@]}" \
      || die "tc qdisc ${args[*]} refused on node $i's eth0"
  done
}

cmd_unshape() {
  local target="${1:-}"
  [[ -n "$target" ]] || die "unshape needs NODE or all"
  require_net_admin
  local list i; list=$(targets "$target")
  for i in $list; do
    if [[ -f "$run_dir/$(ns_name "$i").pid" ]]; then  # an emulated link: back to a veth
      stop_emulated_link "$i"
      make_veth "$i"
      continue
    fi
    tc qdisc del dev "$(veth_name "$i")" root 2> /dev/null || true
    ip netns exec "$(ns_name "$i")" tc qdisc del dev eth0 root 2> /dev/null || true
  done
}

targets() {
  if [[ "$1" == all ]]; then
    local all; all=$(nodes)
    [[ -n "$all" ]] || die "no nodes (make them with 'up N')"
    echo "$all"
  else
    check_node_index "$1"; echo "$1"
  fi
}

cmd_bytes() {
  check_node_index "${1:-}"
  local s=/sys/class/net/$(veth_name "$1")/statistics
  echo "$(cat "$s/tx_bytes") $(cat "$s/rx_bytes")"
}

cmd_status() {
  local i
  [[ -n "$(nodes)" ]] || { echo "no nodes"; return; }
  for i in $(nodes); do
    local addr qd
    addr=$(ip -n "$(ns_name "$i")" -4 -o addr show dev eth0 2> /dev/null | awk '{print $4}')
    qd=$(tc qdisc show dev "$(veth_name "$i")" root 2> /dev/null | head -1)
    local emu="" stats="$run_dir/$(ns_name "$i").stats"
    [[ -f "$run_dir/$(ns_name "$i").pid" ]] && emu="; emulated link (scripts/netns-link.py) $(cat "$stats" 2> /dev/null)"
    echo "node $i: $(ns_name "$i") $addr via $(veth_name "$i"); bytes tx/rx $(cmd_bytes "$i"); $qd$emu"
  done
}

# One mpirun in the root namespace, one app context per node, each started through
# `ip netns exec`. Only the tcp and self BTLs: shared memory (vader) must not join ranks of
# different "nodes", and the TCP BTL and the runtime's out-of-band channel are kept on the
# bridge's subnet so no byte takes the loopback. PMIx's server (inside mpirun) must listen on the
# root namespace's bridge address: by default it listens on the loopback, which a namespace does
# not share, and MPI_Init in the ranks fails with "OPAL ERROR: Unreachable".
cmd_mpirun() {
  local per="${1:-}"; shift || true
  [[ "$per" =~ ^[0-9]+$ ]] && (( per >= 1 )) || die "mpirun needs RANKS_PER_NODE >= 1, got '$per'"
  [[ "${1:-}" == "--" ]] || die "mpirun RANKS_PER_NODE -- CMD ARGS..."
  shift
  (( $# )) || die "mpirun: no command"
  local all; all=$(nodes)
  [[ -n "$all" ]] || die "no nodes (make them with 'up N')"
  local argv=() i first=1
  for i in $all; do
    (( first )) || argv+=(:)
    first=0
    argv+=(-np "$per" ip netns exec "$(ns_name "$i")" "$@")
  done
  PMIX_MCA_ptl_tcp_if_include="$subnet.0/24" \
  exec mpirun --allow-run-as-root --oversubscribe --bind-to none \
    --mca btl tcp,self --mca btl_tcp_if_include "$subnet.0/24" \
    --mca oob_tcp_if_include "$subnet.0/24" \
    "${argv[@]}"
}

cmd_with() {
  local n="${1:-}"; shift || true
  [[ "${1:-}" == "--" ]] || die "with N -- CMD ARGS..."
  shift
  (( $# )) || die "with: no command"
  trap cmd_down EXIT
  trap 'exit 130' INT TERM
  cmd_up "$n"
  "$@"
}

case "${1:-}" in
  up) shift; cmd_up "$@" ;;
  down) require_net_admin; cmd_down ;;
  shape) shift; cmd_shape "$@" ;;
  unshape) shift; cmd_unshape "$@" ;;
  status) cmd_status ;;
  bytes) shift; cmd_bytes "$@" ;;
  mpirun) shift; cmd_mpirun "$@" ;;
  with) shift; cmd_with "$@" ;;
  -h|--help|help|"") usage ;;
  *) echo "netns-cluster: unknown command '$1'" >&2; usage ;;
esac
