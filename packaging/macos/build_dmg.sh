#!/usr/bin/env bash
# Builds dist/Tandem.app and dist/Tandem-<version>.dmg on macOS (Apple silicon or Intel) from
# the same packaging/tandem.spec; the spec's BUNDLE step writes the .app and its Info.plist
# (bundle id org.tandem.Tandem, version from pyproject.toml, NSHighResolutionCapable, macOS 12+).
# Not buildable or tested on Linux.
#
# Needs: Python 3.11, the project venv (`make venv` works on macOS and installs the default torch
# wheel; Tandem runs on the CPU there), and hdiutil (part of macOS).
#   packaging/macos/build_dmg.sh
# Signing and notarisation (optional, needed to open without a Gatekeeper warning):
#   CODESIGN_IDENTITY="Developer ID Application: ..." NOTARY_PROFILE=tandem packaging/macos/build_dmg.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
VENV="${VENV:-.venv}"
PY="$VENV/bin/python"
VERSION="$("$PY" -c 'import tomllib; print(tomllib.load(open("pyproject.toml", "rb"))["project"]["version"])')"

"$PY" -c 'import PyInstaller' 2>/dev/null || "$PY" -m pip install -q "pyinstaller>=6.10"
# The icon is converted from resources/icons/tandem.png to .icns by PyInstaller (needs Pillow).
"$PY" -m pip install -q pillow
rm -rf dist/Tandem.app dist/tandem
"$PY" -m PyInstaller --noconfirm --distpath dist --workpath build/pyinstaller packaging/tandem.spec

APP=dist/Tandem.app
"$APP/Contents/MacOS/tandem" --version

if [ -n "${CODESIGN_IDENTITY:-}" ]; then
  codesign --force --deep --options runtime --timestamp --sign "$CODESIGN_IDENTITY" "$APP"
fi

DMG="dist/Tandem-$VERSION.dmg"
STAGE="build/dmg"
rm -rf "$STAGE" "$DMG"
mkdir -p "$STAGE"
cp -R "$APP" "$STAGE/"
ln -s /Applications "$STAGE/Applications"
hdiutil create -volname "Tandem $VERSION" -srcfolder "$STAGE" -ov -format UDZO "$DMG"

if [ -n "${CODESIGN_IDENTITY:-}" ] && [ -n "${NOTARY_PROFILE:-}" ]; then
  codesign --sign "$CODESIGN_IDENTITY" --timestamp "$DMG"
  xcrun notarytool submit "$DMG" --keychain-profile "$NOTARY_PROFILE" --wait
  xcrun stapler staple "$DMG"
fi
echo "$DMG"
