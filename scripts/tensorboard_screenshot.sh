#!/usr/bin/env bash
# A real TensorBoard screenshot of a real zero training run, for docs/MONITORING.md:
#
#   bash scripts/tensorboard_screenshot.sh          # -> docs/images/tensorboard_loss_memory.png
#
# What it does (idempotent: every run starts from a fresh runs/monitored and overwrites the image):
#   1. installs headless Chromium and pngquant from Debian's packages if they are missing
#      (apt-get update once, then apt-get install -y chromium pngquant). These are docs tools
#      for this script only, NOT dependencies of the zero project (setup.sh never installs them);
#   2. runs the main job, 2 ranks at ZeRO stage 2, with configs/stage2_monitored.json, whose
#      "tensorboard" block writes DeepSpeed's scalars (rank 0) and zero's memory per rank to
#      runs/monitored/tensorboard; $STEPS steps (default 300: the loss falls from ~6.3 to ~1.2,
#      well under a minute or two on 2 CPU cores);
#   3. starts TensorBoard on 127.0.0.1 only, on a free port, in the background (killed on exit),
#      and waits until it serves the run's whole loss curve;
#   4. screenshots TensorBoard's Scalars dashboard with headless Chromium, filtered by the URL
#      fragment to the loss, the learning rate and four memory curves per rank
#      (category param/gradient/optimizer_state and the process RSS, rank 0 above rank 1),
#      smoothing 0; checks that the charts really drew lines (retries otherwise), shrinks
#      the PNG with pngquant;
#   5. prints where the image is.
#
# Knobs (environment): STEPS (training steps, default 300), IMAGE (output path),
# WINDOW (Chromium's window in CSS pixels, default 1760,1040; the image is 1.25x that).
# Nothing but 127.0.0.1 is ever listened on. Must run as root (or with sudo on PATH) only
# when Chromium/pngquant still have to be installed.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$(pwd)

STEPS=${STEPS:-300}
IMAGE=${IMAGE:-docs/images/tensorboard_loss_memory.png}
WINDOW=${WINDOW:-1760,1040}
CONFIG=configs/stage2_monitored.json
RUN_DIR=runs/monitored                 # the config's tensorboard/csv/memory_report output_path
TB_DIR=$RUN_DIR/tensorboard            # output_path + job_name of the config's tensorboard block
PYTHON=${PYTHON:-python3}
START=$(date +%s)

# ---- 1. headless Chromium (+ pngquant) from Debian, only if missing ------------------------
missing=()
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
command -v pngquant >/dev/null 2>&1 || missing+=(pngquant)
if ((${#missing[@]})); then
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO=sudo
  echo "[screenshot] installing ${missing[*]} from Debian (docs tool, not a zero dependency)"
  $SUDO apt-get update
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y "${missing[@]}"
fi
"$PYTHON" -c 'import PIL' 2>/dev/null || {
  echo "[screenshot] needs Pillow (python3 -c 'import PIL') to check the rendered charts" >&2
  exit 1
}

# ---- 2. the main job, into a fresh runs/monitored -------------------------------------------
rm -rf "$RUN_DIR"
mkdir -p "$RUN_DIR"
# The ranks run examples/train_gpt.py by path, so the checkout itself goes on PYTHONPATH
# (it does not rely on how, or where, zero was pip-installed).
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
echo "[screenshot] training $STEPS steps: $CONFIG (log: $RUN_DIR/train.log)"
"$PYTHON" -m zero.launcher.runner --num_procs 2 examples/train_gpt.py \
  --deepspeed_config "$CONFIG" --steps "$STEPS" >"$RUN_DIR/train.log" 2>&1 || {
  tail -n 30 "$RUN_DIR/train.log" >&2
  echo "[screenshot] the training run failed (log above)" >&2
  exit 1
}
grep -E '^step ' "$RUN_DIR/train.log" | sed -n '1p;$p'
TRAINED=$(date +%s)

# Only rank 0 writes event files: one run = one file. Anything else in the folder was written
# by another process using the same config/paths, and TensorBoard would merge it into this
# run (an older step in a later file even purges the curve), so refuse instead of showing it.
list_events() { find "$TB_DIR" -maxdepth 1 -name 'events.out.tfevents.*' | sort; }
EVENTS=$(list_events)
if [ "$(printf '%s\n' "$EVENTS" | grep -c .)" -ne 1 ]; then
  echo "[screenshot] expected exactly one event file in $TB_DIR, found:" >&2
  printf '  %s\n' $EVENTS >&2
  echo "[screenshot] another process writes to $RUN_DIR; rerun when it is done" >&2
  exit 1
fi

# ---- 3. TensorBoard on 127.0.0.1:<free port>, killed on exit -------------------------------
WORK=$(mktemp -d)                     # Chromium's throwaway profile and the logs of this run
TB_PID=""
cleanup() {
  if [ -n "$TB_PID" ] && kill -0 "$TB_PID" 2>/dev/null; then
    kill "$TB_PID" 2>/dev/null || true
    wait "$TB_PID" 2>/dev/null || true
  fi
  rm -rf "$WORK"
}
trap cleanup EXIT
PORT=$("$PYTHON" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
if command -v tensorboard >/dev/null 2>&1; then TB=(tensorboard); else TB=("$PYTHON" -m tensorboard.main); fi
"${TB[@]}" --logdir "$TB_DIR" --host 127.0.0.1 --port "$PORT" >"$WORK/tensorboard.log" 2>&1 &
TB_PID=$!
BASE="http://127.0.0.1:$PORT"
echo "[screenshot] TensorBoard $BASE (pid $TB_PID)"

# Ready = it answers AND its scalars plugin serves all $STEPS loss points and rank 1's memory.
"$PYTHON" - "$BASE" "$STEPS" "$TB_PID" "$WORK/tensorboard.log" <<'EOF'
import json, os, sys, time, urllib.parse, urllib.request
base, steps, pid, log = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
def get(path):
    with urllib.request.urlopen(base + path, timeout=5) as r:
        return json.load(r)
deadline, last = time.time() + 120, "no answer"
while time.time() < deadline:
    try:
        os.kill(pid, 0)
    except OSError:
        sys.exit("TensorBoard exited:\n" + open(log).read()[-2000:])
    try:
        tags = get("/data/plugin/scalars/tags").get(".", {})
        loss = get("/data/plugin/scalars/scalars?run=.&tag="
                   + urllib.parse.quote("Train/Samples/train_loss", safe=""))
        if len(loss) >= steps and "Memory/rank1/process/rss_bytes" in tags:
            print(f"[screenshot] TensorBoard serves {len(tags)} scalar tags, {len(loss)} loss points "
                  f"({loss[0][2]:.3f} at sample {loss[0][1]} -> {loss[-1][2]:.3f} at {loss[-1][1]})")
            sys.exit(0)
        last = f"{len(tags)} tags, {len(loss)} loss points"
    except Exception as error:  # not up yet
        last = repr(error)
    time.sleep(1)
sys.exit(f"TensorBoard not ready after 120 s: {last}")
EOF

# ---- 4. the screenshot ------------------------------------------------------------------------
# TensorBoard 2.21's legacy Scalars dashboard reads its state from the URL fragment:
# tagFilter (a regex over tags) and _smoothingWeight. Tags sort alphabetically and the charts
# flow 4 to a row at this width, so the rows are: rank 0's gradient/optimizer_state/param/RSS,
# rank 1's, then lr and train_loss. (The Time Series dashboard takes ?tagFilter=&smoothing=0
# as query parameters, but in headless Chromium its cards were at times still blank when the
# virtual time ran out; the Scalars dashboard rendered every time.)
FILTER='Memory/rank[01]/(category/(param|gradient|optimizer_state)|process)|Train/Samples/(train_loss|lr)'
FRAGMENT="scalars&tagFilter=$("$PYTHON" -c 'import sys, urllib.parse; print(urllib.parse.quote(sys.argv[1], safe=""))' "$FILTER")&_smoothingWeight=0"
URL="$BASE/#$FRAGMENT"
mkdir -p "$(dirname "$IMAGE")"
RAW="$WORK/raw.png"
for attempt in 1 2 3; do
  rm -f "$RAW"
  chromium --headless --no-sandbox --disable-gpu --hide-scrollbars \
    --user-data-dir="$WORK/chromium-profile" --force-device-scale-factor=1.25 \
    --window-size="$WINDOW" --virtual-time-budget=20000 \
    --screenshot="$RAW" "$URL" >>"$WORK/chromium.log" 2>&1 || true
  # Did the charts draw? Count the run's line colour (#ff7043) right of the sidebar: 10
  # drawn charts give ~9000 such pixels, blank cards or a spinner ~0.
  if [ -s "$RAW" ] && "$PYTHON" - "$RAW" <<'EOF'
import sys
from PIL import Image
image = Image.open(sys.argv[1]).convert("RGB")
width, height = image.size
charts = image.crop((width // 5, height // 10, width, height))
drawn = dict((colour, count) for count, colour in charts.getcolors(1 << 24)).get((255, 112, 67), 0)
print(f"[screenshot] {width}x{height} PNG, {drawn} line pixels")
sys.exit(0 if drawn >= 3000 else 1)
EOF
  then
    break
  fi
  echo "[screenshot] attempt $attempt: charts not drawn yet, retrying" >&2
  [ "$attempt" -lt 3 ] || { echo "[screenshot] no rendered charts (see $URL)" >&2; exit 1; }
done

# The event files must still be the one this run wrote (nobody wrote into it meanwhile).
if [ "$(list_events)" != "$EVENTS" ]; then
  echo "[screenshot] $TB_DIR changed while TensorBoard was showing it; rerun" >&2
  exit 1
fi
pngquant --force --skip-if-larger --quality=70-95 --output "$IMAGE" "$RAW" || cp "$RAW" "$IMAGE"

# ---- 5. where it is -----------------------------------------------------------------------------
END=$(date +%s)
echo "[screenshot] URL fragment: #$FRAGMENT"
echo "[screenshot] training $((TRAINED - START)) s, total $((END - START)) s"
echo "[screenshot] wrote $REPO/$IMAGE ($(wc -c <"$IMAGE") bytes)"
