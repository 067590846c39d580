#!/usr/bin/env bash
# Board power and SM clock while a command runs (nvidia-smi sampled every 50 ms), as medians over the
# samples whose power is above a third of the peak (the busy part):
#   backends/cuda/scripts/clock-during.sh <command...>
set -uo pipefail
log=$(mktemp)
nvidia-smi --query-gpu=power.draw,clocks.sm --format=csv,noheader,nounits -lms 50 > "$log" &
smi=$!
"$@"
rc=$?
kill $smi 2>/dev/null
python3 - "$log" <<'PY'
import statistics, sys
rows = []
for line in open(sys.argv[1]):
    try:
        rows.append(tuple(map(float, line.split(","))))
    except ValueError:
        pass
if not rows:
    sys.exit("no samples")
peak = max(p for p, _ in rows)
busy = [r for r in rows if r[0] > peak / 3]
print(f"busy samples {len(busy)} of {len(rows)}: power median {statistics.median(p for p, _ in busy):.0f} W "
      f"(peak {peak:.0f}), SM clock median {statistics.median(c for _, c in busy):.0f} MHz")
PY
exit $rc
