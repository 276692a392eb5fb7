#!/usr/bin/env bash
# Emulated hosts and links: every stagewise process runs in its own network
# namespace (its own address, as on a separate host), all joined through one
# bridge, and every host's link is shaped with `tc tbf` to a chosen rate in
# both directions. Together with the emulated accelerators (model `emulated`:
# blocks that wait instead of computing, docs/models.md) this shows where the
# links, not the stages, set the speed: e.g. PETRA's backward message carries
# the rebuilt input as well as the gradient (twice the bytes of the others),
# and fp16/bf16 wire compression (transport.compression) halves everything.
# With --replicas R the job runs R replicated pipelines (stages.replicas,
# docs/replicas.md) on J x R hosts, each replica keeping --batch samples per
# step, so the replicas' gradient all-reduce (gloo's TCP) crosses the shaped
# links too; --sync compares averaging every step with the outer
# synchronisation every H steps (sync.every).
#
#   tests/bench/link_bench.sh [options]
#     --stages 4                 J workers (J hosts + one for the coordinator)
#     --replicas 1               R replicas of every stage (J x R worker hosts)
#     --sync "1"                 sync.every values to compare (with R > 1)
#     --rates "off 10gbit 1gbit" link rates (tc units; off = not shaped)
#     --algorithms "1f1b delayed petra"
#                                1f1b/gpipe (backprop, M = 2J micro-batches),
#                                or any algorithm name (backprop, delayed, petra,
#                                features_replay, nwise, auxnet)
#     --compression "none fp16"  transport.compression values (none, fp16, bf16,
#                                int8, int4; auto: the planner's choice at the
#                                rate, with placement.link_gbps set to it)
#     --rounds 3                 every configuration once per round, interleaved
#     --steps 60                 mini-batches per job
#     --shape 16,32,32           per-sample activation [C, H, W] (C even)
#     --batch 32                 samples per mini-batch (per replica)
#     --forward-ms 5 --backward-ms 10
#                                emulated work per block and mini-batch (2
#                                blocks per stage)
#     --smoke                    one short job at one shaped rate; exit 1 if it
#                                does not succeed (the test suite's check)
#     --keep                     keep the logs (printed path)
#
# Prints, per configuration, the median time per mini-batch over the rounds
# (from the job's samples/s, pipeline fill included), its spread
# ((max - min) / median), the ratio to the unshaped run of the same round, and
# two floors: the stages' compute (the algorithm's ideal schedule) and the
# busiest link (bytes a middle host sends per mini-batch / rate).
#
# Link latency (netem is missing on these machines): the workers inherit
# STAGEWISE_EMULATE_LINK_DELAY_MS, their emulated one-way delay per incoming
# data message (stagewise-worker --emulate-link-delay-ms), e.g.
#   STAGEWISE_EMULATE_LINK_DELAY_MS=25 tests/bench/link_bench.sh
#
# Needs root (ip netns, veth, tc) and iproute2; without them it prints why and
# exits 77 (ctest's skip code). Everything it creates (namespaces, links,
# processes, the temporary directory) is removed on exit.
set -euo pipefail
cd "$(dirname "$0")/../.."
BIN=${BIN:-build/bin}
J=4
R=1
SYNC="1"
RATES="off 10gbit 1gbit"
ALGORITHMS="1f1b delayed petra"
COMPRESSION="none fp16"
ROUNDS=3
STEPS=60
SHAPE=16,32,32
BATCH=32
FWD=5
BWD=10
SMOKE=0
KEEP=0
usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit "${1:-0}"; }
while [ $# -gt 0 ]; do
  case "$1" in
    --stages) J=$2; shift 2 ;;
    --replicas) R=$2; shift 2 ;;
    --sync) SYNC=$2; shift 2 ;;
    --rates) RATES=$2; shift 2 ;;
    --algorithms) ALGORITHMS=$2; shift 2 ;;
    --compression) COMPRESSION=$2; shift 2 ;;
    --rounds) ROUNDS=$2; shift 2 ;;
    --steps) STEPS=$2; shift 2 ;;
    --shape) SHAPE=$2; shift 2 ;;
    --batch) BATCH=$2; shift 2 ;;
    --forward-ms) FWD=$2; shift 2 ;;
    --backward-ms) BWD=$2; shift 2 ;;
    --smoke) SMOKE=1; shift ;;
    --keep) KEEP=1; shift ;;
    -h|--help) usage 0 ;;
    *) echo "link_bench: unknown option $1 (--help lists them)" >&2; exit 2 ;;
  esac
done
if [ "$SMOKE" = 1 ]; then
  J=2; R=1; SYNC=1; RATES="200mbit"; ALGORITHMS="petra"; COMPRESSION="fp16"; ROUNDS=1; STEPS=8
  SHAPE=4,16,16
fi
[ "$R" -ge 1 ] 2>/dev/null || { echo "link_bench: --replicas must be >= 1" >&2; exit 2; }
[ "$R" -gt 1 ] || SYNC=1
WORKERS=$(( J * R ))
for exe in stagewise stagewise-coordinator stagewise-worker; do
  [ -x "$BIN/$exe" ] || { echo "link_bench: $BIN/$exe not built (scripts/setup)" >&2; exit 2; }
done
skip() { echo "link_bench: skipped: $*"; exit 77; }
[ "$(id -u)" = 0 ] || skip "needs root (network namespaces, veth, tc)"
command -v ip >/dev/null && command -v tc >/dev/null || skip "needs iproute2 (ip, tc)"

P="swl$$"          # prefix of every namespace and link name (unique per run)
NET="10.$((200 + $$ % 50)).$(($$ / 50 % 250))"
HUB="${P}hub"
TMP=$(mktemp -d /tmp/stagewise-link-XXXXXX)
PIDS=()
HOSTS=()
cleanup() {
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
  for ns in "${HOSTS[@]}" "$HUB"; do ip netns del "$ns" 2>/dev/null || true; done
  if [ "$KEEP" = 1 ]; then echo "link_bench: logs kept in $TMP"; else rm -rf "$TMP"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

ip netns add "$HUB" 2>/dev/null || skip "cannot create a network namespace here"
ip -n "$HUB" link set lo up
ip -n "$HUB" link add br0 type bridge
ip -n "$HUB" link set br0 up
# Host 0 runs the coordinator (and the CLI), hosts 1..J x R the workers.
for i in $(seq 0 "$WORKERS"); do
  ns="${P}h$i"
  HOSTS+=("$ns")
  ip netns add "$ns"
  ip -n "$ns" link set lo up
  ip link add "${P}e$i" type veth peer name "${P}p$i"
  ip link set "${P}e$i" netns "$ns"
  ip link set "${P}p$i" netns "$HUB"
  ip -n "$ns" link set "${P}e$i" name eth0
  ip -n "$ns" addr add "$NET.$((i + 1))/24" dev eth0
  ip -n "$ns" link set eth0 up
  ip -n "$HUB" link set "${P}p$i" master br0 up
done

# tbf on both ends of every host's link: the host's egress (what it sends)
# and the bridge port's egress (what it receives). The bucket holds at least
# 4 ms at the rate and never less than 256 KiB (veth passes 64 KiB GSO frames).
shape() {
  local rate=$1 i burst bits
  if [ "$rate" != off ]; then
    bits=$(python3 -c "import re,sys; m=re.fullmatch(r'([0-9.]+)([kmg]?)bit','$rate'.lower()); \
      sys.exit('bad rate $rate (e.g. 1gbit, 500mbit)') if not m else \
      print(int(float(m[1])*{'':1,'k':1e3,'m':1e6,'g':1e9}[m[2]]))")
    burst=$(( bits / 8 / 250 )); [ "$burst" -lt 262144 ] && burst=262144
  fi
  for i in $(seq 0 "$WORKERS"); do
    if [ "$rate" = off ]; then
      tc -n "${P}h$i" qdisc del dev eth0 root 2>/dev/null || true
      tc -n "$HUB" qdisc del dev "${P}p$i" root 2>/dev/null || true
    else
      tc -n "${P}h$i" qdisc replace dev eth0 root tbf rate "$rate" burst "$burst" latency 200ms
      tc -n "$HUB" qdisc replace dev "${P}p$i" root tbf rate "$rate" burst "$burst" latency 200ms
    fi
  done
}

COORD="$NET.1:7070"
ip netns exec "${P}h0" "$BIN/stagewise-coordinator" --listen "$COORD" --metrics-listen "" \
  --db "$TMP/coordinator.db" --insecure --log-level warning >"$TMP/coordinator.log" 2>&1 &
PIDS+=($!)
# The namespaces share this machine's /dev/shm, where neighbouring workers
# would find each other's shared-memory rings and pass the shaped links by
# (docs/transport.md, "Neighbours on one host"): off, as on separate hosts.
for i in $(seq 1 "$WORKERS"); do
  ip netns exec "${P}h$i" "$BIN/stagewise-worker" --coordinator "$COORD" \
    --listen "$NET.$((i + 1)):7071" --advertise "$NET.$((i + 1))" --metrics-listen "" \
    --name "host$i" --threads 1 --insecure --log-level warning --shared-memory-dir '' \
    >"$TMP/worker$i.log" 2>&1 &
  PIDS+=($!)
done
cli() { ip netns exec "${P}h0" "$BIN/stagewise" --coordinator "$COORD" --insecure "$@"; }
for _ in $(seq 1 150); do
  n=$(cli workers -o json 2>/dev/null | python3 -c \
    "import json,sys; print(len(json.load(sys.stdin)))" 2>/dev/null || echo 0)
  [ "$n" -ge "$WORKERS" ] && break
  sleep 0.2
done
[ "${n:-0}" -ge "$WORKERS" ] || { echo "link_bench: only ${n:-0} of $WORKERS workers registered" >&2;
  tail -n 5 "$TMP"/*.log >&2; exit 1; }

IFS=, read -r C H W <<<"$SHAPE"
ACT_BYTES=$(( BATCH * C * H * W * 4 ))   # one float32 activation message
partition() {
  local out="" j
  for j in $(seq 0 $((J - 1))); do
    local end=$(( 2 * j + 2 )); [ "$j" = $((J - 1)) ] && end=$(( 2 * J + 1 ))
    out+="${out:+, }[$((2 * j)), $end]"
  done
  echo "[$out]"
}
algorithm_yaml() {
  case "$1" in
    1f1b|gpipe) echo "{name: backprop, micro_batches: $((2 * J)), schedule: $1}" ;;
    nwise) echo "{name: nwise, n: 2, micro_batches: 2}" ;;
    *) echo "{name: $1}" ;;
  esac
}
# Floors per mini-batch, in ms: "compute link" for algorithm $1, compression $2, rate $3.
floors() {
  python3 - "$@" "$J" "$FWD" "$BWD" "$ACT_BYTES" <<'PY'
import re, sys
alg, comp, rate, J, F, B, act = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), \
    2 * float(sys.argv[5]), 2 * float(sys.argv[6]), int(sys.argv[7])
M = 2 * J
compute = {"1f1b": (M + J - 1) / M * (F + B), "gpipe": (M + J - 1) / M * (F + B),
           "backprop": J * (F + B), "delayed": 2 * F + B, "petra": 2 * F + B,
           "features_replay": 2 * F + B, "auxnet": F + B}.get(alg)
# A middle host sends the forward activation on and the gradient back (PETRA:
# the rebuilt input too) through its one link; with J = 2 the first host
# sends only forward and the last only backward.
back = 2 if alg == "petra" else 1
# Bytes on the wire per float32 byte (int8/int4: a float32 scale per block of 64).
ratio = {"fp16": 0.5, "bf16": 0.5, "int8": 0.25 + 1 / 64, "int4": 0.125 + 1 / 64}.get(comp, 1.0)
sent = act * ((1 + back) if J > 2 else back) * ratio
m = re.fullmatch(r"([0-9.]+)([kmg]?)bit", rate.lower())
link = sent * 8 / (float(m[1]) * {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}[m[2]]) * 1e3 if m else 0
# auto: the formats are the planner's, per stage (no one floor).
print(f"{compute:.1f}" if compute else "-", f"{link:.1f}" if m and comp != "auto" else "-")
PY
}

# A tc rate in Gbit/s (placement.link_gbps); off: 10.
gbps() {
  python3 -c "import re,sys; m=re.fullmatch(r'([0-9.]+)([kmg]?)bit','$1'.lower()); \
    print(float(m[1])*{'':1e-9,'k':1e-6,'m':1e-3,'g':1}[m[2]] if m else 10)"
}

RESULTS="$TMP/results.txt"
: >"$RESULTS"
echo "link_bench: J=$J x R=$R hosts in namespaces $P*, net $NET.0/24; activation message $((ACT_BYTES / 1024)) KiB;" \
  "F=$FWD ms, B=$BWD ms per block, 2 blocks per stage; $ROUNDS round(s) of $STEPS steps"
for round in $(seq 1 "$ROUNDS"); do
  for rate in $RATES; do
    shape "$rate"
    for alg in $ALGORITHMS; do
      for comp in $COMPRESSION; do
       for every in $SYNC; do
        wire=$comp; [ "$R" = 1 ] || wire="$comp/H$every"
        name="link-$alg-$rate-${wire/\//-}-r$round"
        # An emulated block waits its time per batch_size samples, scaled to
        # the samples it sees: R x the times keep each replica's share of
        # --batch at --forward-ms/--backward-ms (every replica a device as
        # fast as the R = 1 one).
        cat >"$TMP/$name.yaml" <<EOF
name: $name
model: {name: emulated, depth: $((2 * J)), forward_ms: $((FWD * R)), backward_ms: $((BWD * R))}
data: {dataset: synthetic, shape: [$C, $H, $W], train_size: $((BATCH * R * 16)), test_size: $BATCH}
algorithm: $(algorithm_yaml "$alg")
stages: {partition: $(partition), replicas: $R}
optimizer: {name: sgd, lr: 0.01}
batch_size: $((BATCH * R))
steps: $STEPS
eval: {every_epochs: 0, at_end: false}
EOF
        [ "$comp" = none ] || echo "transport: {compression: $comp}" >>"$TMP/$name.yaml"
        # auto: the planner sizes the formats for this rate (unshaped: 10 Gbit/s).
        [ "$comp" != auto ] || echo "placement: {link_gbps: $(gbps "$rate")}" >>"$TMP/$name.yaml"
        [ "$every" = 1 ] || echo "sync: {every: $every}" >>"$TMP/$name.yaml"
        if ! out=$(cli submit "$TMP/$name.yaml" -q -o json 2>"$TMP/$name.err"); then
          echo "link_bench: $name failed: $(tail -3 "$TMP/$name.err")" >&2
          tail -n 5 "$TMP"/worker*.log >&2
          exit 1
        fi
        sps=$(python3 -c "import json,sys; print(json.loads(sys.argv[1]).get('samples_per_second') or 0)" "$out")
        echo "$round $alg $wire $rate $sps" >>"$RESULTS"
        printf '  round %s  %-8s %-8s %-8s %8.1f samples/s\n' "$round" "$alg" "$wire" "$rate" "$sps"
       done
      done
    done
  done
done
if [ "$SMOKE" = 1 ]; then
  echo "link_bench: smoke run succeeded"
  exit 0
fi

echo
echo "time per mini-batch (ms), median of $ROUNDS round(s); ratio = time / unshaped time in the same round"
[ "$R" = 1 ] || echo "(R = $R replicas of $BATCH samples: a mini-batch is $((BATCH * R)) samples;" \
  "the link floor counts the stage messages, not the all-reduce)"
printf '%-9s %-8s %-8s %9s %7s %7s %9s %7s\n' algorithm wire rate "ms/batch" spread ratio compute link
for alg in $ALGORITHMS; do
  for comp in $COMPRESSION; do
   for every in $SYNC; do
    wire=$comp; [ "$R" = 1 ] || wire="$comp/H$every"
    for rate in $RATES; do
      read -r compute link <<<"$(floors "$alg" "$comp" "$rate")"
      python3 - "$RESULTS" "$alg" "$wire" "$rate" "$((BATCH * R))" "$compute" "$link" <<'PY'
import statistics, sys
path, alg, comp, rate, batch, compute, link = sys.argv[1:8]
rows = [l.split() for l in open(path)]
def ms(r, rt):  # time per mini-batch of round r at rate rt
    for x in rows:
        if x[0] == r and x[1] == alg and x[2] == comp and x[3] == rt and float(x[4]) > 0:
            return float(batch) / float(x[4]) * 1e3
    return None
rounds = sorted({x[0] for x in rows})
times = [t for t in (ms(r, rate) for r in rounds) if t]
ratios = [a / b for a, b in ((ms(r, rate), ms(r, "off")) for r in rounds) if a and b]
med = statistics.median(times)
spread = (max(times) - min(times)) / med * 100
ratio = f"{statistics.median(ratios):.2f}" if ratios else "-"
print(f"{alg:<9} {comp:<8} {rate:<8} {med:9.1f} {spread:6.1f}% {ratio:>7} {compute:>9} {link:>7}")
PY
    done
   done
  done
done
