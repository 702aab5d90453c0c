#!/usr/bin/env bash
# A C++ compiler with a precompiled header, for tools/setup_env.sh's mmcv build
# (CXX=tools/pch_cxx.sh). 63 of the 77 C++ files of mmcv 2.1.0's CPU build
# start with `#include "pytorch_cpp_helper.hpp"`, which pulls in torch's
# headers: parsing them is most of each file's compile time. The first
# compile also precompiles that header with its own flags into PCH_DIR;
# every call searches PCH_DIR first, so GCC loads the .gch for each file that
# includes the header first, and, where the flags differ, warns
# (-Winvalid-pch) and reads the header as usual. The object code is the same
# either way.
#   PCH_HEADER=.../pytorch_cpp_helper.hpp PCH_DIR=DIR [PCH_REAL_CXX=c++] \
#     tools/pch_cxx.sh COMPILER-ARGS...
# A header that does not precompile (PCH_DIR/NAME.gch.failed, with the
# compiler's message) leaves every compile as it would be without this.
set -euo pipefail
REAL="${PCH_REAL_CXX:-c++}"
HEADER="${PCH_HEADER:?the header to precompile}"
DIR="${PCH_DIR:?where the precompiled header goes}"
GCH="$DIR/$(basename "$HEADER").gch"

COMPILE=0
for ARG in "$@"; do [ "$ARG" = -c ] && COMPILE=1; done
# Probes (-v, --version) and the link pass straight through.
if [ "$COMPILE" = 1 ] && [ ! -e "$GCH" ] && [ ! -e "$GCH.failed" ]; then
  mkdir -p "$DIR"
  exec 9>"$GCH.lock"
  flock 9  # two compiles start at once: one precompiles, the other waits
  if [ ! -e "$GCH" ] && [ ! -e "$GCH.failed" ]; then
    # This call's flags without its source, output and dependency file.
    FLAGS=() DROP=0
    for ARG in "$@"; do
      if [ "$DROP" = 1 ]; then DROP=0; continue; fi
      case "$ARG" in
        -o|-MF|-MT|-MQ) DROP=1 ;;
        -c|-MMD|-MD) ;;
        *.cpp|*.cc|*.cxx) ;;
        *) FLAGS+=("$ARG") ;;
      esac
    done
    if "$REAL" "${FLAGS[@]}" -x c++-header "$HEADER" -o "$GCH.tmp" 2>"$GCH.log"; then
      mv "$GCH.tmp" "$GCH"
    else
      mv "$GCH.log" "$GCH.failed"
    fi
  fi
  exec 9>&-
fi
exec "$REAL" -I"$DIR" -Winvalid-pch "$@"
