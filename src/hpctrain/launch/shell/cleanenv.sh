# shellcheck shell=bash
# summary: per task: pass the allow-listed variables into the image as APPTAINERENV_*/SINGULARITYENV_*
# Its values come before it (site/runtimes/sif.py: cleanenv_wrapper).
# the allowed variables as $hpctrain_prefix* (APPTAINERENV_, SINGULARITYENV_): passed even with --cleanenv
for v in $(compgen -e); do
  for p in "${hpctrain_pass[@]?}"; do
    # shellcheck disable=SC2254  # a glob on purpose: container.pass_env names NAME_* prefixes
    case $v in $p) export "${hpctrain_prefix?}$v=${!v}"; break ;; esac
  done
done
exec "$@"
