#!/bin/sh
# Walk through the app on a real X server (Xvfb + openbox), saving a screenshot after each step: from an
# empty cache and config, with a busy loop on every core (packaging/walkthrough.py --warm / --quiet lift
# these), timing the waits and checking that no two figures for the same thing disagree.
# Needs: apt-get install -y xvfb xauth libxcb-icccm4 libxcb-keysyms1 openbox imagemagick xdotool
set -eu
cd "$(dirname "$0")/.."
OUT="${1:-packaging/screenshots}"
shift 2>/dev/null || true
FLAGS="$*"
PYTHON="${PYTHON:-.venv/bin/python}"
mkdir -p "$OUT"
unset QT_QPA_PLATFORM
xvfb-run --auto-servernum --server-args="-screen 0 1600x1000x24" sh -c "
  openbox >/dev/null 2>&1 &
  sleep 1
  $PYTHON packaging/walkthrough.py '$OUT' $FLAGS
"
