#!/usr/bin/env bash
# The built wheel as users install it, each way in a fresh virtual environment (packages from
# PyPI) under a temporary folder that is removed at the end:
#   bare      `pip install aio-dms`: the runtime core and the transports import, `aio-dms --version`
#             and `aio-dms demo` work, `aio-dms run` and `model-info` are refused in one line
#             that says what to install (exit 2);
#   [dms]     `pip install 'aio-dms[dms]'` (plus pytest and pytest-asyncio): `aio-dms --version`,
#             `model-info`, `run --frames 40`, a video camera refused in one line that names
#             the video extra; a user's pytest file on the aio_runtime plugin; mypy
#             --strict (the development environment's, pointed at this environment's interpreter)
#             over a user's code typed against DmsService, and over a copy with a deliberate type
#             error, which it must report; then the video, report and fleet extras added one by
#             one, each one's installed size printed.
# Usage: scripts/wheel-check/check.sh DEV_PYTHON (the development environment's interpreter, which
# builds the wheel and runs mypy). Prints each check; the first that fails ends it, saying why.
set -euo pipefail

dev_python=${1:?usage: $0 DEV_PYTHON}
case $dev_python in
  */*) dev_python="$(cd "$(dirname "$dev_python")" && pwd)/$(basename "$dev_python")" ;; # absolute;
esac # a virtual environment's link is kept, not resolved (that would leave the environment)
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/aio-dms-wheel-check.XXXXXX")
trap 'rm -rf "$work"' EXIT
export AIO_DMS_CACHE_DIR="$work/cache"  # the reference model is built afresh, as on first use
export PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONNOUSERSITE=1
unset PYTHONPATH MYPYPATH VIRTUAL_ENV
extra_line="pip install 'aio-dms[dms]'"
SECONDS=0
mkdir "$work/cwd"

fail() {
  printf '\nwheel-check FAILED: %s\n' "$1" >&2
  exit 1
}

# expect CODE WHAT COMMAND...: runs COMMAND in an empty folder (away from the checkout, so only
# what is installed can be imported), its output in $out and $err; fails unless it exits CODE.
expect() {
  local code=$1 what=$2 rc=0
  shift 2
  (cd "$work/cwd" && timeout 600 "$@") >"$work/out" 2>"$work/err" || rc=$?
  out=$(cat "$work/out")
  err=$(cat "$work/err")
  if [ "$rc" -ne "$code" ]; then
    printf '%s\n' "--- stdout (end)" "$(tail -n 20 "$work/out")" "--- stderr (end)" \
      "$(tail -n 20 "$work/err")" >&2
    fail "$what: exit $rc, expected $code ($*)"
  fi
  echo "  ok: $what"
}

step() { printf '\n== %s\n' "$1"; }

site_packages_kib() { du -sk "$("$1/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')" | cut -f1; }

step "build the wheel (from a copy of the working tree: no stale build/ folder gets in)"
"$dev_python" - "$root" "$work/src" <<'PY'
import shutil, sys
ignored = shutil.ignore_patterns(
    ".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", ".*_cache", ".hypothesis"
)
shutil.copytree(sys.argv[1], sys.argv[2], ignore=ignored)
PY
expect 0 "pip wheel --no-deps" "$dev_python" -m pip wheel --quiet --no-deps --wheel-dir "$work/dist" "$work/src"
wheel=$(ls "$work"/dist/aio_dms-*.whl)
version=$(basename "$wheel" | cut -d- -f2)
echo "  built $(basename "$wheel")"
expect 0 "the wheel ships py.typed for aio_runtime, transports and pipelines; no tests" \
  "$dev_python" -c '
import sys, zipfile
names = set(zipfile.ZipFile(sys.argv[1]).namelist())
missing = [p for p in ("aio_runtime", "transports", "pipelines") if f"{p}/py.typed" not in names]
stray = sorted(n for n in names if n.startswith(("tests/", "scripts/", "benchmarks/")))
sys.exit(f"py.typed missing for {missing}" if missing else f"not for users: {stray}" if stray else 0)
' "$wheel"

step "bare: pip install aio-dms (no extra)"
expect 0 "a fresh virtual environment" "$dev_python" -m venv "$work/bare"
venv_kib=$(site_packages_kib "$work/bare")  # what a fresh environment holds already (pip)
expect 0 "pip install $(basename "$wheel")" "$work/bare/bin/python" -m pip install --quiet "$wheel"
expect 0 "none of the DMS service's heavier dependencies came with it" "$work/bare/bin/python" -c '
import importlib.util, sys
heavy = ["onnxruntime", "onnx", "av", "zmq", "prometheus_client", "starlette", "hypercorn",
         "matplotlib"]
present = [name for name in heavy if importlib.util.find_spec(name) is not None]
sys.exit(f"installed without the dms extra: {present}" if present else 0)'
expect 0 "every module of aio_runtime and transports imports" \
  "$work/bare/bin/python" "$here/import_core.py"
echo "  $out"
expect 0 "aio-dms --version" "$work/bare/bin/aio-dms" --version
[ "$out" = "aio-dms $version" ] || fail "aio-dms --version printed '$out', expected 'aio-dms $version'"
expect 0 "__version__ of the three packages" "$work/bare/bin/python" -c \
  'import aio_runtime, transports, pipelines; print(aio_runtime.__version__, transports.__version__, pipelines.__version__)'
[ "$out" = "$version $version $version" ] || fail "__version__: '$out', expected $version three times"
expect 0 "aio-dms demo" "$work/bare/bin/aio-dms" demo
[[ "$(tail -n 1 "$work/out")" == "demo done:"* ]] || fail "aio-dms demo did not end with its 'demo done:' line"
for command in "run --frames 1" "model-info"; do
  # shellcheck disable=SC2086  # the command's words
  expect 2 "aio-dms $command is refused" "$work/bare/bin/aio-dms" $command
  [ -z "$out" ] || fail "aio-dms $command wrote to standard output: $out"
  [ "$(wc -l <"$work/err")" -eq 1 ] || fail "aio-dms $command: not one line on standard error: $err"
  [[ "$err" == *"(no module named '"*"'): $extra_line" ]] || fail "aio-dms $command said: $err"
  echo "     $err"
done

step "with the dms extra: pip install 'aio-dms[dms]' (and pytest, pytest-asyncio for the user's tests)"
expect 0 "a fresh virtual environment" "$dev_python" -m venv "$work/dms"
expect 0 "pip install $(basename "$wheel")[dms]" \
  "$work/dms/bin/python" -m pip install --quiet "$wheel[dms]"
dms_kib=$(site_packages_kib "$work/dms")
expect 0 "pip install pytest pytest-asyncio" \
  "$work/dms/bin/python" -m pip install --quiet pytest pytest-asyncio
expect 0 "aio-dms --version" "$work/dms/bin/aio-dms" --version
[ "$out" = "aio-dms $version" ] || fail "aio-dms --version printed '$out', expected 'aio-dms $version'"
expect 0 "aio-dms model-info (the reference model built on first use)" \
  "$work/dms/bin/aio-dms" model-info
"$dev_python" -c 'import json, sys; c = json.load(sys.stdin); sys.exit(0 if c.get("inputs") else "no inputs")' \
  <<<"$out" || fail "aio-dms model-info did not print a model contract: $out"
# Not about lateness: with a 2 s budget no frame of a busy machine's is late (a run with not one
# valid frame fails); health on any free port, never one in use.
expect 0 "aio-dms run --frames 40 --budget 2 --health-port 0" \
  "$work/dms/bin/aio-dms" run --frames 40 --budget 2 --health-port 0
grep -q "summary" "$work/out" || fail "aio-dms run printed no summary"
printf '\x00\x00\x00\x18ftypmp42' >"$work/cabin.mp4"
expect 2 "aio-dms run --camera cabin.mp4 is refused without the video extra" \
  "$work/dms/bin/aio-dms" run --camera "$work/cabin.mp4" --frames 1 --health-port 0
[[ "$err" == *"the video extra, which is not installed (no module named 'av'): pip install 'aio-dms[video]'" ]] ||
  fail "aio-dms run --camera cabin.mp4 said: $err"
echo "     $err"
mkdir "$work/user"
cp "$here/test_user_kit.py" "$work/user/"
expect 0 "a user's pytest file on the aio_runtime plugin (ledger, captured_logs, virtual time)" \
  "$work/dms/bin/python" -m pytest -q -p no:cacheprovider \
  -o asyncio_default_fixture_loop_scope=function "$work/user/test_user_kit.py"
echo "     $(tail -n 1 "$work/out")"
mkdir "$work/typed"
cp "$here/typed_user.py" "$here/typed_user_mistake.py" "$work/typed/"
mypy=("$dev_python" -m mypy --strict --python-executable "$work/dms/bin/python" --cache-dir "$work/mypy")
expect 0 "mypy --strict over a user's code typed against DmsService" \
  "${mypy[@]}" "$work/typed/typed_user.py"
mistake_line=$(grep -n "# the mistake" "$work/typed/typed_user_mistake.py" | cut -d: -f1)
expect 1 "mypy --strict reports the deliberate type error" \
  "${mypy[@]}" "$work/typed/typed_user_mistake.py"
[[ "$out" == *"typed_user_mistake.py:$mistake_line: error:"* && "$out" == *"Found 1 error"* ]] ||
  fail "mypy did not report exactly the deliberate error on line $mistake_line: $out"
echo "     $(head -n 1 "$work/out")"

step "the other extras, each added to the dms environment (pytest and pytest-asyncio apart)"
sizes=()
before_kib=$(site_packages_kib "$work/dms")
for extra in video report fleet; do
  expect 0 "pip install $(basename "$wheel")[$extra]" \
    "$work/dms/bin/python" -m pip install --quiet "$wheel[$extra]"
  after_kib=$(site_packages_kib "$work/dms")
  sizes+=("$extra +$(((after_kib - before_kib) / 1024)) MiB")
  before_kib=$after_kib
done

step "installed size (site-packages, less the $((venv_kib / 1024)) MiB a fresh environment holds)"
bare_kib=$(site_packages_kib "$work/bare")
echo "  bare: $(((bare_kib - venv_kib) / 1024)) MiB; with the dms extra: $(((dms_kib - venv_kib) / 1024)) MiB"
echo "  added to the dms extra: $(IFS=';'; echo "${sizes[*]}" | sed 's/;/, /g')"
printf '\nwheel-check passed in %d s\n' "$SECONDS"
