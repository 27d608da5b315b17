#!/usr/bin/env bash
# `make test` on a busy machine: one CPU-bound process per CPU, at default priority and unpinned,
# for the whole run. The suite's tests must not depend on the machine being idle. Sets no variable
# and selects no test; exits with `make test`'s status (and fails if a burner died on the way).
set -uo pipefail
cd "$(dirname "$0")/.."

burners=()
stop_burners() {
  for pid in "${burners[@]}"; do kill "$pid" 2>/dev/null; done
  wait "${burners[@]}" 2>/dev/null
}
trap stop_burners EXIT

for _ in $(seq "$(nproc)"); do
  python3 -c 'while True: pass' &
  burners+=("$!")
done
echo "test-under-load: ${#burners[@]} CPU-bound processes beside make test" >&2

make test
status=$?

for pid in "${burners[@]}"; do
  if ! kill -0 "$pid" 2>/dev/null; then
    echo "test-under-load: burner $pid was no longer running at the end" >&2
    status=1
  fi
done
echo "test-under-load: make test exited $status" >&2
exit "$status"
