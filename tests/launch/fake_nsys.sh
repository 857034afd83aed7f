#!/bin/bash
# A stand-in for Nsight Systems' `nsys profile [options] APP ARGS...`: records its arguments (one line,
# in $FAKE_NSYS_LOG) and runs APP ARGS as nsys does, the property the wrapping relies on.
set -euo pipefail
printf '%s\n' "$*" >> "${FAKE_NSYS_LOG:?}"
[ "${1:-}" = profile ] || { echo "fake nsys: only 'profile' is known" >&2; exit 2; }
shift
while [ $# -gt 0 ] && [ "${1#-}" != "$1" ]; do shift; done  # --opt=value options only (as we write them)
exec "$@"
