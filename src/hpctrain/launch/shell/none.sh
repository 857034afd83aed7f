# shellcheck shell=bash
# summary: CONTAINER=none: the host's Python, the submitted hpctrain first on PYTHONPATH
# the submitted hpctrain first (not the submitting shell's PYTHONPATH, which an --export=NONE
# site drops); an installed copy's site-packages is the host Python's own already
if [ -n "$HPCTRAIN_SOURCE" ]; then
  if [ "$(basename "$HPCTRAIN_SOURCE")" != hpctrain ] || [[ "$(dirname "$HPCTRAIN_SOURCE")" == *:* ]]; then
    echo "hpctrain: HPCTRAIN_SOURCE=$HPCTRAIN_SOURCE must be a package directory named hpctrain" \
      "in a path without ':' (PYTHONPATH separates with it)" >&2
    exit 1
  fi
  case ${HPCTRAIN_SOURCE%/*} in */site-packages|*/dist-packages) ;;
    *) export PYTHONPATH="${HPCTRAIN_SOURCE%/*}${PYTHONPATH:+:$PYTHONPATH}" ;; esac
fi
