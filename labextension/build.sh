#!/usr/bin/env bash
# Builds composespawner-lab (the prebuilt JupyterLab extension) into
# composespawner_lab/labextension, once per lock, sources and JupyterLab core: the
# result is kept in ~/.cache/composespawner/labextension-<hash>, so a later run (a fresh
# clone too) only copies it. Cold: npm ci, tsc, then JupyterLab 4.6's own builder
# (jupyter-builder, what `jupyter labextension build` runs) against the venv's core.
#   bash labextension/build.sh [VENV]      (make labextension)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
venv="$(cd "${1:-$here/../.venv}" && pwd)"
out="$here/composespawner_lab/labextension"
core="$("$venv/bin/python" -c 'import jupyterlab, pathlib
print(pathlib.Path(jupyterlab.__file__).parent / "staging" / "package.json")')"

cd "$here"
key="$( (cat package.json package-lock.json tsconfig.json install.json "$core"
         find src style -type f | LC_ALL=C sort | xargs cat) | sha256sum | cut -c1-16)"
cache="${XDG_CACHE_HOME:-$HOME/.cache}/composespawner/labextension-$key"

if [ ! -f "$cache/package.json" ]; then
  started=$SECONDS
  lock="$(sha256sum package-lock.json | cut -c1-16)"
  if [ ! -f "node_modules/.installed-$lock" ]; then
    npm ci --no-audit --no-fund --loglevel=error
    touch "node_modules/.installed-$lock"
  fi
  rm -rf lib tsconfig.tsbuildinfo "$out"
  npx tsc
  PATH="$venv/bin:$PATH" jupyter-builder build --core-package-file "$core" . >/dev/null
  cp install.json "$out/"
  mkdir -p "$(dirname "$cache")"
  partial="$(mktemp -d "$cache.partial.XXXXXX")"
  cp -r "$out/." "$partial/"
  chmod -R a+rX "$partial"  # mktemp -d makes it 0700
  # Another build may have finished first: theirs is as good as ours.
  mv -T "$partial" "$cache" 2>/dev/null || rm -rf "$partial"
  echo "composespawner-lab built in $((SECONDS - started)) s, cached in $cache"
fi
if ! diff -rq "$cache" "$out" >/dev/null 2>&1; then
  rm -rf "$out"
  cp -r "$cache" "$out"
fi
# Readable by all: a compute host's agent copies it into a stack as its build account.
chmod -R a+rX "$out"
