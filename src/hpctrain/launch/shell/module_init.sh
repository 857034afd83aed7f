# shellcheck shell=bash
# summary: source the module system's init where modules load and `module` is missing (a non-login batch shell)
if [ -n "$hpctrain_modules" ] && ! type module >/dev/null 2>&1; then
  for f in "${LMOD_PKG:+$LMOD_PKG/init/bash}" "${MODULESHOME:+$MODULESHOME/init/bash}" /usr/share/lmod/lmod/init/bash; do
    # shellcheck source=/dev/null  # the module system's own init script, found here at run time
    if [ -n "$f" ] && [ -r "$f" ]; then . "$f"; break; fi
  done
fi
