#!/usr/bin/env bash
# Runs a command (default: the whole suite) beside two CPU-bound hogs, one per core of a
# 2-core CI runner, and prints how long it took and the box's load: the check that the
# suite's timing tests hold on a busy machine (issue 29). The hogs are this script's
# children, killed on the way out whatever happens.
#
#   tests/load/run_under_load.sh                     # .venv/bin/python -m pytest tests
#   HOGS=4 tests/load/run_under_load.sh .venv/bin/python -m pytest tests/e2e
set -uo pipefail
cd "$(dirname "$0")/../.."
HOGS=${HOGS:-2}
if [ $# -eq 0 ]; then set -- .venv/bin/python -m pytest tests; fi
hogs=()
cleanup() { [ ${#hogs[@]} -gt 0 ] && kill "${hogs[@]}" 2>/dev/null; wait 2>/dev/null; }
trap cleanup EXIT
trap 'exit 130' INT TERM
for _ in $(seq "$HOGS"); do
    # A pure-Python spin (no I/O, no sleep): as many runnable tasks as the box has cores.
    python3 -c 'while True: pass' &
    hogs+=("$!")
done
echo "run_under_load: $HOGS CPU hogs (pids ${hogs[*]}), load before: $(cut -d' ' -f1-3 /proc/loadavg)"
start=$(date +%s)
"$@"
rc=$?
echo "run_under_load: exit $rc after $(( $(date +%s) - start )) s, load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
exit $rc
