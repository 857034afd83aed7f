#!/bin/bash
# A stand-in for enroot's `list` and `remove`, over the fake pyxis plugin's containers
# (tests/launch/fake_pyxis.c): the files in $ENROOT_DATA_PATH (tests/launch/pyxis.py's wrapper sets it
# to the plugin's runtime_path/<uid>/<node>), as enroot's own are the directories in its ENROOT_DATA_PATH.
# As enroot (src/runtime.sh, runtime::list and runtime::remove): `list` prints `ls -1` of the data
# path; `remove [-f|--force] [--] NAME...` refuses a NAME with '/' and a NAME that is not there (and
# stops at it), and asks for a confirmation without -f.
set -eu
data=${ENROOT_DATA_PATH:?ENROOT_DATA_PATH is not set}
err() { echo "[ERROR] $*" >&2; exit 1; }
case ${1:-} in
  list)
    mkdir -p -- "$data"
    cd -- "$data" && ls -1 ;;
  remove)
    shift
    force=""
    while [ $# -gt 0 ]; do
      case $1 in -f|--force) force=y; shift ;; --) shift; break ;; -?*) err "unknown option $1" ;; *) break ;; esac
    done
    [ $# -gt 0 ] || err "Usage: enroot remove [options] [--] NAME..."
    for name in "$@"; do
      [ -n "$name" ] && [[ $name != */* ]] || err "Invalid argument: $name"
      [ -e "$data/$name" ] || err "No such file or directory: $data/$name"
      if [ -z "$force" ]; then
        read -r -p "Do you really want to delete $data/$name? [y/N] " reply
        [ "$reply" = y ] || [ "$reply" = Y ] || continue
      fi
      rm -rf -- "${data:?}/$name"
    done ;;
  *) err "fake enroot: only list and remove" ;;
esac
