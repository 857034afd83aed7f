#!/bin/bash
# A stand-in for `apptainer exec` that reproduces the one property the requeue path relies on:
# inside the container no Slurm client can run. Like Apptainer it sets its own PATH and keeps the
# rest of the environment (plus --env K=V); unlike the host, every Slurm command is masked (a
# private mount namespace binds /dev/null over each) and SLURM_CONF is unset, as in the NGC and
# pytorch images, which ship no Slurm client, munge socket or slurm.conf.
# Usage (as the batch script calls it): apptainer exec [--nv] [--env K=V] [--bind X] IMAGE python3 ARGS...
set -euo pipefail
[ "${1:-}" = exec ] || { echo "fake apptainer: only 'exec' is supported" >&2; exit 2; }
shift
while [ $# -gt 0 ]; do
  case "$1" in
    --nv) shift ;;
    --env) export "$2"; shift 2 ;;
    --bind|-B) shift 2 ;;
    -*) echo "fake apptainer: unknown option $1" >&2; exit 2 ;;
    *) break ;;
  esac
done
image=$1; shift
[ -f "$image" ] || { echo "fake apptainer: image $image not found" >&2; exit 255; }
[ "$1" = python3 ] && shift && set -- "${FAKE_APPTAINER_PYTHON:?the image python}" "$@"
masks=""
for c in scontrol sbatch squeue sacct srun scancel sinfo salloc; do
  p=$(command -v "$c" || true)
  [ -n "$p" ] && masks="$masks mount --bind /dev/null $p;"
done
exec unshare --mount sh -c "$masks"' exec env -u SLURM_CONF PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin "$@"' fake-apptainer "$@"
