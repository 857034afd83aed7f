# shellcheck shell=bash
# summary: the modules to load: those of the variable hpctrain_modules_var names (a failed load stops the job)
hpctrain_modules=${!hpctrain_modules_var} hpctrain_modules_host=1
