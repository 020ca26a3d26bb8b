#!/usr/bin/env bash
# ensure.sh KIND VENV PINFILE [NODEPS_PINFILE]: create or refresh one venv from exact pins.
# Idempotent: a stamp inside the venv holds the sha256 of the pin files; unchanged pins do nothing.
set -euo pipefail
kind=$1 venv=$2 pins=$3 nodeps=${4:-}
python=${PYTHON:-python3}
here=$(cd "$(dirname "$0")/.." && pwd)
# The export venv holds rkaudio itself (editable): pyproject.toml's package list is part of its pins.
own=()
[[ $kind == export ]] && own=("$here/pyproject.toml")
want=$(cat "$pins" ${nodeps:+"$nodeps"} "$0" "${own[@]}" | sha256sum | cut -d' ' -f1)
stamp="$venv/.rkaudio-pins"
if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
  echo "venv $venv is up to date"
  exit 0
fi
echo "creating $kind venv $venv from $pins (about a minute)"
rm -rf "$venv"
"$python" -m venv "$venv"
pip=("$venv/bin/python" -m pip install --quiet --disable-pip-version-check)
if [[ $kind == export ]]; then
  # torch==2.13.0 resolves to the local CPU wheel; a CUDA build is never pulled because every
  # package is pinned exactly and installed without resolving new versions.
  "${pip[@]}" -r "$pins"
  [[ -n "$nodeps" ]] && "${pip[@]}" --no-deps -r "$nodeps"
  "${pip[@]}" --no-deps --no-build-isolation -e "$here"
else
  # The toolkit declares torch<=2.4 (CUDA, 5.6 GB): install everything --no-deps from exact pins.
  "${pip[@]}" --no-deps -r "$pins"
  "$venv/bin/python" -c "from rknn.api import RKNN" >/dev/null
fi
echo "$want" > "$stamp"
echo "venv $venv ready"
