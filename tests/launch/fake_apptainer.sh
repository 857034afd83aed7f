#!/bin/bash
# A stand-in for `apptainer exec` that reproduces what the launch path relies on, no more:
# - inside the "container" no Slurm client can run: every Slurm command is masked (a private mount
#   namespace binds /dev/null over each) and SLURM_CONF is unset, as in the NGC and pytorch images,
#   which ship no Slurm client, munge socket or slurm.conf;
# - Apptainer's environment rules: its own PATH; the host environment passes unless --cleanenv;
#   APPTAINERENV_X=v becomes X=v inside, even with --cleanenv; --env K=V sets K;
# - --bind SRC[:DST[:ro]] makes SRC visible at DST (a bind mount in that namespace);
# - a host directory the image does not show unless bound: $FAKE_APPTAINER_HIDE (colon-separated, e.g.
#   a site's /lustre) is covered by an empty tmpfs before the binds are made (Apptainer shows only
#   its default binds - $HOME, /tmp, /var/tmp, $PWD... - and the --bind ones);
# - inside, APPTAINER_CONTAINER is the image's path (Apptainer sets it; `hpctrain doctor` reads it);
# - the image's own Python packages come after PYTHONPATH ($FAKE_APPTAINER_SITE, e.g. an older
#   hpctrain installed in the image); `python3` is the image's Python ($FAKE_APPTAINER_PYTHON), and
#   $FAKE_APPTAINER_BIN (if set) holds the image's other programs, first on its PATH (e.g. `jupyter`).
# - `exec` reads the image file (all of it: a real one reads the parts of the SIF the task touches), so a
#   test can count the reads of a shared image (container.stage_image, tests/launch/test_stage_image.py);
# Called as `singularity` (a link named so), it is SingularityCE instead: SINGULARITYENV_X=v becomes X=v,
# APPTAINERENV_* are plain host variables to it (dropped by --cleanenv: SingularityCE does not read
# them, apptainer-userdocs "singularity_compatibility"), and inside SINGULARITY_CONTAINER is set.
# `--version` answers as the real one (SingularityCE: singularity-ce version ...).
# Usage (as the batch script calls it): apptainer exec [--nv] [--cleanenv] [--env K=V] [--bind X] IMAGE CMD...
set -euo pipefail
case ${0##*/} in
  singularity*) export FAKE_ENVP=SINGULARITYENV_ FAKE_CVAR=SINGULARITY_CONTAINER ;;
  *) export FAKE_ENVP=APPTAINERENV_ FAKE_CVAR=APPTAINER_CONTAINER ;;
esac
if [ "${1:-}" = --inside ]; then  # second stage, in the private mount namespace
  shift
  for c in scontrol sbatch squeue sacct srun scancel sinfo salloc; do
    # every copy on PATH (a test cluster's client wrappers come first, the real clients after them)
    for p in $(type -ap "$c"); do mount --bind /dev/null "$p"; done
  done
  fds=() dsts=() ros=()
  while IFS= read -r b; do  # hold each source open: a hidden one stays reachable through its fd
    [ -n "$b" ] || continue
    IFS=: read -r src dst opts <<< "$b"
    exec {fd}< "$src"
    fds+=("$fd") dsts+=("${dst:-$src}") ros+=("${opts:-}")
  done <<< "$FAKE_BINDS"
  IFS=: read -r -a hidden <<< "${FAKE_APPTAINER_HIDE:-}"
  for h in "${hidden[@]}"; do [ -z "$h" ] || mount -t tmpfs fake-apptainer-hide "$h"; done
  for i in "${!fds[@]}"; do
    mkdir -p "${dsts[$i]}"  # Apptainer creates missing mount points (underlay)
    mount -c --bind "/proc/self/fd/${fds[$i]}" "${dsts[$i]}"
    if [ "${ros[$i]}" = ro ]; then mount -o remount,bind,ro "${dsts[$i]}"; fi
  done
  envs=()
  while IFS= read -r -d '' kv; do
    case "$kv" in
      "$FAKE_ENVP"*) envs+=("${kv#"$FAKE_ENVP"}") ;;
      FAKE_*|SLURM_CONF=*|PATH=*|PYTHONPATH=*) ;;
      *) if [ "$FAKE_CLEANENV" = 0 ]; then envs+=("$kv"); fi ;;
    esac
  done < <(env -0)
  pypath=""
  for kv in ${FAKE_HOST_PYTHONPATH:+"PYTHONPATH=$FAKE_HOST_PYTHONPATH"} "${envs[@]}"; do
    case "$kv" in PYTHONPATH=*) pypath=${kv#PYTHONPATH=} ;; esac
  done
  [ "$FAKE_CLEANENV" = 0 ] || case " ${envs[*]} " in *" PYTHONPATH="*) ;; *) pypath="" ;; esac
  site=${FAKE_APPTAINER_SITE:-}
  pypath=${pypath:+$pypath${site:+:}}$site
  cmd=("$@")
  [ "${cmd[0]}" = python3 ] && cmd[0]=$FAKE_APPTAINER_PYTHON
  userns=()  # an ordinary user's task: back to their own uid and gid (Apptainer keeps them)
  [ "$FAKE_UID" = 0 ] || userns=(unshare --user "--map-user=$FAKE_UID" "--map-group=$FAKE_GID")
  exec "${userns[@]}" env -i "${envs[@]}" "$FAKE_CVAR=$FAKE_IMAGE" PATH=${FAKE_APPTAINER_BIN:+$FAKE_APPTAINER_BIN:}/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    ${pypath:+"PYTHONPATH=$pypath"} "${cmd[@]}"
fi
if [ "${1:-}" = --version ]; then  # what each prints (docs/runtimes.md: how runtimes.py tells them apart)
  case ${0##*/} in singularity*) echo "singularity-ce version 4.1.0" ;; *) echo "apptainer version 1.3.4" ;; esac
  exit 0
fi
[ "${1:-}" = exec ] || { echo "fake ${0##*/}: only 'exec' and --version are supported" >&2; exit 2; }
shift
export FAKE_CLEANENV=0 FAKE_BINDS="" FAKE_HOST_PYTHONPATH="${PYTHONPATH:-}"
while [ $# -gt 0 ]; do
  case "$1" in
    --nv) shift ;;
    --cleanenv|-e) FAKE_CLEANENV=1; shift ;;
    --env) export "$FAKE_ENVP$2"; shift 2 ;;
    --bind|-B) FAKE_BINDS+="$2"$'\n'; shift 2 ;;
    -*) echo "fake apptainer: unknown option $1" >&2; exit 2 ;;
    *) break ;;
  esac
done
[ -f "$1" ] || { echo "fake apptainer: image $1 not found" >&2; exit 255; }
cat -- "$1" > /dev/null  # the image is read, by the task's own apptainer
export FAKE_IMAGE=$1
shift
: "${FAKE_APPTAINER_PYTHON:?the image python}"
# An ordinary user's mounts are made as root of a user namespace of their own, as an unprivileged
# Apptainer does; the command then runs as the user again (a second user namespace mapping them back).
export FAKE_UID FAKE_GID
FAKE_UID=$(id -u) FAKE_GID=$(id -g)
if [ "$FAKE_UID" = 0 ]; then exec unshare --mount "$0" --inside "$@"; fi
exec unshare --user --map-root-user --mount "$0" --inside "$@"
