# shellcheck shell=bash
# summary: pyxis, per task in the image: keep the image's variables and the allow-list, drop the host's rest
# Its values come before it (site/runtimes/pyxis.py: image_env_wrapper).
# keep the variables of the image itself (the enroot image format lists them in /etc/environment) and the
# allow-list; drop the rest of the host environment that pyxis passed in
keep=" "
if [ -r /etc/environment ]; then
  while IFS= read -r l || [ -n "$l" ]; do
    l=${l#export }
    case $l in [A-Za-z_]*=*) keep+="${l%%=*} " ;; esac
  done < /etc/environment
fi
for v in $(compgen -e); do
  for p in "${hpctrain_pass[@]?}"; do
    # shellcheck disable=SC2254  # a glob on purpose: container.pass_env names NAME_* prefixes
    case $v in $p) continue 2 ;; esac
  done
  case $keep in *" $v "*) ;; *) unset "$v" ;; esac
done
export PYTHONNOUSERSITE=1
if [ -n "${HPCTRAIN_SOURCE:-}" ]; then export PYTHONPATH=${hpctrain_mount?}; fi
exec "$@"
