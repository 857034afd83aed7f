# shellcheck shell=bash
# summary: --nsys-ranks: wrap the tasks' Python in the nsys program
# --nsys-ranks: those tasks run their Python under the image's nsys (launch.container.nsys_wrapper)
hpctrain_py=${HPCTRAIN_PYTHON[-1]}; unset "HPCTRAIN_PYTHON[-1]"
HPCTRAIN_PYTHON+=(bash -c "${hpctrain_nsys?}" hpctrain-nsys "$hpctrain_py")
