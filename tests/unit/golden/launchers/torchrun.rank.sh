#!/usr/bin/env bash
# gtrain rank wrapper: torchrun starts this once per local rank (it sets RANK, LOCAL_RANK, WORLD_SIZE).
# It gives each global rank its own log file and records the rank's own exit code and when it ended.
log=/home/u/gtrain/demo/jobs/demo-20260101-000000-abcd/logs/rank-"${RANK}".log
trap 'kill -TERM "$child" 2>/dev/null' TERM INT HUP
python3 -u "$@" >>"$log" 2>&1 </dev/null &
child=$!
wait "$child"; rc=$?
while kill -0 "$child" 2>/dev/null; do wait "$child"; rc=$?; done
printf '%s %s\n' "$rc" "$(date +%s.%N)" > /home/u/gtrain/demo/jobs/demo-20260101-000000-abcd/logs/rank-"${RANK}".exit
exit "$rc"
