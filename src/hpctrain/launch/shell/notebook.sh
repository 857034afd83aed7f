# shellcheck shell=bash
# summary: the notebook job: a fresh token in a 0600 file, exported to Jupyter, never printed
# The file is removed first, since a redirection into an existing file keeps its old mode; it holds no
# newline (Jupyter reads JUPYTER_TOKEN_FILE verbatim, should a site use that). Values: hpctrain_token_dir,
# hpctrain_port (launch/notebook.py).
token_file="$hpctrain_token_dir/notebook-${SLURM_JOB_ID:?}.token"
(umask 077 && mkdir -p "$hpctrain_token_dir" && rm -f "$token_file" &&
  head -c 32 /dev/urandom | od -An -v -tx1 | tr -d ' \n' > "$token_file")
JUPYTER_TOKEN=$(cat "$token_file")
export JUPYTER_TOKEN
echo "hpctrain-notebook: node $(hostname -s) port $hpctrain_port token in $token_file"
export PYTHONNOUSERSITE=1
