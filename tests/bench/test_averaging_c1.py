"""The C1 bench's plan: a ring that keeps hosts behind NAT apart, and each strategy's bound."""

import pytest

from bench.averaging_c1 import CONFIGURATIONS, Configuration, bounds, ring_order


@pytest.mark.parametrize("hosts, firewalled", [(8, (5, 7)), (8, ()), (5, (0, 1)), (4, (1, 2))])
def test_the_ring_never_puts_two_hosts_behind_nat_side_by_side(hosts, firewalled):
    order = ring_order(hosts, firewalled)
    assert sorted(order) == list(range(hosts))
    for position, host in enumerate(order):
        assert not {host, order[position - 1]} <= set(firewalled), order


def test_a_ring_with_more_hosts_behind_nat_than_open_ones_is_refused():
    with pytest.raises(ValueError, match="more hosts behind NAT"):
        ring_order(3, (0, 1))


def test_each_strategys_bound_is_what_its_busiest_link_carries():
    size = 10e6  # bytes: 80 Mbit
    configuration = Configuration((100, 100, 20, 20))
    bound = bounds(size, configuration, shares=[0.5, 0.5, 0.0, 0.0])
    assert bound["ring"] == pytest.approx(2 * 3 / 4 * 80 / 20)  # the slowest host carries 2(n - 1)/n of S
    assert bound["server"] == pytest.approx(max(80 / 20, 3 * 80 / 100))  # a worker's S, or the server's 3 S
    assert bound["adaptive"] == pytest.approx(80 / 20)  # a zero-share host sends and reads S, overlapped
    assert bounds(size, CONFIGURATIONS["homogeneous"], [1 / 8] * 8)["adaptive"] == pytest.approx(
        bounds(size, CONFIGURATIONS["homogeneous"], [1 / 8] * 8)["ring"])
