# shellcheck shell=bash
# summary: container.stage_image, per task: start from the node's checked local copy of the image
# container.stage_image: the image argument becomes the staged copy on this node, once it is checked
# (this uid's private directory, this uid's file, the shared image's size, mtime and identity); else
# (the copy step never ran here, or the copy is not ours) the task reads the shared image, and says why;
# silently on a node whose copier skipped staging (stage_step.sh's $HPCTRAIN_STAGE_SKIP: it said why once)
case " ${HPCTRAIN_STAGE_SKIP:-} " in
  *" ${SLURMD_NODENAME:-$(hostname)} "*) hpctrain_why=skipped ;;
  *) hpctrain_why=$(hpctrain_copy_problem) ;;
esac
if [ -z "$hpctrain_why" ]; then
  a=("$@") p=""
  for i in "${!a[@]}"; do
    if [ "$p" != --bind ] && [ "${a[i]}" = "$HPCTRAIN_IMAGE" ]; then a[i]=${hpctrain_local?}; break; fi
    p=${a[i]}
  done
  set -- "${a[@]}"
elif [ "$hpctrain_why" != skipped ]; then
  echo "hpctrain: not using the staged image on $(hostname): $hpctrain_why; this task reads $HPCTRAIN_IMAGE" >&2
fi
