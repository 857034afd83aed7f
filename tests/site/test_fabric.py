"""The gloo interface each task derives from the site's NCCL_SOCKET_IFNAME (`site/fabric.py`)."""

from __future__ import annotations

import pytest

from hpctrain.site.fabric import gloo_ifname


@pytest.mark.parametrize(
    "pattern, name",
    [
        ("ibp", "ibp24s0"),  # an NCCL prefix → the plain name gloo needs
        ("^docker,lo", "ibp24s0"),  # an exclude list → a name not excluded (ib* first, as NCCL)
        ("=ib0", None),  # absent: leave gloo to its default
        ("ib0", None),
        ("=eno1", "eno1"),
        ("eno,ibp", "eno1"),  # the site's order
    ],
)
def test_gloo_ifname_from_an_nccl_pattern(pattern, name):
    assert gloo_ifname(pattern, ["lo", "eno1", "ibp24s0"]) == name


def test_gloo_ifname_never_loopback_or_docker_from_an_exclude_list():
    assert gloo_ifname("^eno", ["lo", "docker0", "eno1"]) is None
    assert gloo_ifname("=lo", ["lo", "eno1"]) == "lo"  # named: the site's choice
