#!/usr/bin/env bash
# Regenerate the cluster pictures of the README and docs/ from a real photograph:
#   bash docs/make_cluster_figures.sh
# The photograph is grace_hopper.jpg from matplotlib's bundled sample data
# (an official U.S. Navy portrait of Rear Admiral Grace M. Hopper, a work of the
# U.S. federal government and therefore in the public domain). matplotlib is
# already in the environment (mmengine depends on it), so nothing is downloaded.
# No trained checkpoint exists yet: the weights are random (seeded by
# visualize_clusters.py), so the clusters follow colours and edges.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
PHOTO=$("$PY" -c "import matplotlib.cbook as c; print(c.get_sample_data('grace_hopper.jpg', asfileobj=False))")
"$PY" tools/analysis/visualize_clusters.py configs/clustr/clustr-s_8xb128_in1k.py \
    --image "$PHOTO" --out docs/clusters_clustr-s.png --shape 384 320 --tile 176
"$PY" tools/analysis/visualize_clusters.py configs/paca/paca-s_8xb128_in1k.py \
    --image "$PHOTO" --out docs/clusters_paca-s.png --shape 384 320 --tile 160 --num-heatmaps 3
ls -l docs/clusters_clustr-s.png docs/clusters_paca-s.png
