# Sourced by tools/build and tools/build-cuda: compile through ccache where it
# is installed (tools/setup-deps installs it), so a rebuild, another clone's
# CI or the cuda preset reuses every object whose sources did not change.
# CCACHE_BASEDIR makes the clone's own paths relative, so two clones share hits.
ccache_flags=()
if command -v ccache >/dev/null 2>&1; then
  export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$root}"
  ccache_flags=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
fi
