"""doctor/limits.py: the locked-memory limit RDMA needs."""

from __future__ import annotations

from hpctrain.doctor.limits import memlock_check
from hpctrain.doctor.report import run


def test_locked_memory_limit_of_a_login_node_warns_on_rdma_nodes():
    import resource

    inf = resource.RLIM_INFINITY
    assert memlock_check(inf, inf, rdma=True).status == "ok"
    c = memlock_check(64 * 1024, 64 * 1024, rdma=True)
    assert c.status == "warn" and c.value == "64 KiB (hard limit 64 KiB)" and "PropagateResourceLimits" in c.hint
    assert memlock_check(64 * 1024, inf, rdma=True).status == "info"  # the batch script raises it
    assert memlock_check(64 * 1024, 64 * 1024, rdma=False).status == "info"
    assert any(c.name == "locked memory" for c in run().checks)
