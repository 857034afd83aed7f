# shellcheck shell=bash
# summary: per task: the --nsys-ranks tasks run Python under the image's nsys profile
# Its values come before it (launch/container.py: nsys_wrapper).
# the tasks whose global rank is in $hpctrain_ranks run Python under the nsys of the image
r=${SLURM_PROCID:-${RANK:-}}
case " ${hpctrain_ranks[*]?} " in *" $r "*)
  command -v nsys >/dev/null || {
    echo "hpctrain: --nsys-ranks: rank $r finds no nsys on the PATH in the image ($PATH): use an image" \
      "with Nsight Systems (NGC pytorch images have it), or drop --nsys-ranks" >&2
    exit 1
  }
  mkdir -p "${hpctrain_nsys_dir?}"; export HPCTRAIN_NSYS=1
  exec nsys "${hpctrain_nsys_args[@]?}" --output="${hpctrain_nsys_dir?}"/nsys-rank-"$r" "$@" ;;
esac
exec "$@"
