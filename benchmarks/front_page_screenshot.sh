#!/usr/bin/env bash
# The first screen a reader sees (issue 28 point 4): a headless Chromium screenshot of results/index.html at a
# laptop's window size. Needs Debian's chromium (`apt-get install chromium`).
#   bash benchmarks/front_page_screenshot.sh [results/index.html] [front_page.png] [1280,800]
set -euo pipefail
page=$(realpath "${1:-results/index.html}")
out=$(realpath -m "${2:-front_page.png}")
size=${3:-1280,800}
command -v chromium >/dev/null || { echo "chromium not found: apt-get install chromium" >&2; exit 2; }
chromium --headless --no-sandbox --disable-gpu --hide-scrollbars --window-size="$size" --screenshot="$out" \
    "file://$page" 2>/dev/null
echo "first screen of $page at $size -> $out"
