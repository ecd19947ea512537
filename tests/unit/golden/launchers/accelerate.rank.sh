#!/usr/bin/env bash
# gtrain rank wrapper: accelerate launch (torchrun underneath) starts this once per local rank (it sets RANK, LOCAL_RANK, WORLD_SIZE).
# It gives each global rank its own log file and records the rank's own exit code and when it ended.
log=/home/u/gtrain/demo/jobs/demo-20260101-000000-abcd/logs/rank-"${RANK}".log
# gtrain.metrics.log() (or any program: one JSON object per line) writes this rank's metrics here; the job's
# py/ folder holds a copy of gtrain/metrics.py, importable where gtrain itself is not installed.
mkdir -p /home/u/gtrain/demo/jobs/demo-20260101-000000-abcd/metrics
export GTRAIN_METRICS_FILE=/home/u/gtrain/demo/jobs/demo-20260101-000000-abcd/metrics/rank-"${RANK}".jsonl
export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}"/home/u/gtrain/demo/jobs/demo-20260101-000000-abcd/py
launcher=$(cat /home/u/gtrain/demo/jobs/demo-20260101-000000-abcd/pid 2>/dev/null)  # this attempt's launch.sh; a relaunch takes `pid` over
# The rank runs under a small subshell that waits for it with stops ignored and writes the rank's own code: bash
# can lose a child's status when a trapped signal interrupts `wait` (a rank that ended 0 as its peers were being
# stopped was recorded as 143). This shell forwards TERM/INT/HUP to the rank itself.
ranks=/home/u/gtrain/demo/jobs/demo-20260101-000000-abcd/ranks; mkdir -p "$ranks"; pidf="$ranks/${RANK}.pid"; rcf="$ranks/${RANK}.rc"
rm -f "$pidf" "$rcf"
__gtrain_mask() {
  env -u HF_TOKEN python3 /home/u/gtrain/demo/jobs/demo-20260101-000000-abcd/mask.py \
    3< <(for __n in HF_TOKEN; do printf '%s=%s\0' "$__n" "${!__n:-}"; done)
}

# The rank's output reaches its log through __gtrain_mask (the job's secrets masked); the rank ends once it is written.
( exec 4> >(__gtrain_mask >>"$log"); mask=$!
  python3 -u "$@" >&4 2>&4 4>&- </dev/null &
  p=$!; echo "$p" > "$pidf"; exec 4>&-; trap '' TERM INT HUP; wait "$p"; echo "$?" > "$rcf"
  # the filter ends when the last writer closes; a process the rank left behind holding its output does not
  # hold the rank's end: after 5 s the filter is ended (it ignores TERM)
  for _ in $(seq 100); do kill -0 "$mask" 2>/dev/null || break; sleep 0.05; done
  kill -KILL "$mask" 2>/dev/null; wait "$mask" 2>/dev/null ) &
child=$!
forward() {
  local p="" i
  for i in $(seq 40); do p=$(cat "$pidf" 2>/dev/null); [ -n "$p" ] && break; sleep 0.05; done
  kill -TERM "${p:-$child}" 2>/dev/null
}
trap forward TERM INT HUP
wait "$child"; rc=$?
while kill -0 "$child" 2>/dev/null; do wait "$child"; rc=$?; done
[ -s "$rcf" ] && rc=$(cat "$rcf")
# (a rank of an earlier attempt that outlived its stop writes nothing into the next attempt's logs)
if [ "$(cat /home/u/gtrain/demo/jobs/demo-20260101-000000-abcd/pid 2>/dev/null)" = "$launcher" ]; then
  printf '%s %s\n' "$rc" "$(date +%s.%N)" > /home/u/gtrain/demo/jobs/demo-20260101-000000-abcd/logs/rank-"${RANK}".exit
fi
exit "$rc"
