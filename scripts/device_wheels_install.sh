#!/usr/bin/env bash
# On the lent GPU machine: unpack what engine=verl needs from the parts `scripts/device_wheels.py pack` made
# (carried one per call while the machine stayed warm) into SITE, with no package index. Wheels cut into pieces are
# joined first. The plan left out what the machine already satisfies (`--have`), so every wheel here is installed
# as it is (no resolver), into SITE, which then goes first on PYTHONPATH: the machine's own packages stay as they
# are. Prints the versions Python then sees.
#
#   bash scripts/device_wheels_install.sh .whl/parts /tmp/site && export PYTHONPATH=/tmp/site
set -euo pipefail
parts=${1:?usage: device_wheels_install.sh PARTS_DIR SITE}
site=${2:?usage: device_wheels_install.sh PARTS_DIR SITE}
PY=${PY:-python3}
wheels=$(mktemp -d)
for t in "$parts"/part-*.tar; do
    tar -xf "$t" -C "$wheels"
done
for first in "$wheels"/*.whl.piece-0; do
    [ -e "$first" ] || continue
    whl=${first%.piece-0}
    cat $(ls "$whl".piece-* | sort -V) > "$whl"
    rm "$whl".piece-*
done
$PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" "$wheels"/*.whl
# ray is absent where the parts were packed with --exclude ray (local-engine runs): verl's one use of it, a type
# hint, then comes from scripts/device_shims, as in the runs themselves
shims="" ray_version="__import__('ray').__version__"
if [ ! -d "$site/ray" ]; then
    shims=:$(cd "$(dirname "$0")" && pwd)/device_shims ray_version="'not installed (scripts/device_shims stands in)'"
fi
PYTHONPATH=$site$shims $PY -c "import torch, transformers, verl
ray = $ray_version
print('torch', torch.__version__, 'transformers', transformers.__version__, 'verl', verl.__version__, 'ray', ray)"
