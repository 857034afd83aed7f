# shellcheck shell=bash
# summary: the modules to load: those of the variable hpctrain_modules_var names (a failed load stops the job)
# shellcheck disable=SC2034,SC2154  # hpctrain_modules_var: the header's; the others: read by module_*.sh
hpctrain_modules=${!hpctrain_modules_var} hpctrain_modules_host=1
