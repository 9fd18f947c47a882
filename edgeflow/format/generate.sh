#!/bin/sh
# Regenerate edgeflow/format/efl/ from edgeflow/format/schema.fbs.
# flatc writes an __init__.py into every namespace directory it touches, which would
# clobber edgeflow/__init__.py and edgeflow/format/__init__.py; so it writes into a
# scratch directory and only the efl/ package is copied back.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
flatc=${FLATC:-"$root/.venv/bin/flatc"}
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT

"$flatc" --python -o "$scratch" "$here/schema.fbs"
rm -rf "$here/efl"
cp -R "$scratch/edgeflow/format/efl" "$here/efl"
echo "generated $(ls "$here/efl" | wc -l) files in $here/efl with $("$flatc" --version)"
