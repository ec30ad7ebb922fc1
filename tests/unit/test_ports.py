"""tfos.testing.ports: ports for processes that bind later come from below the ephemeral range."""

import socket

from tfos.host.claims import ephemeral_port_range
from tfos.testing.ports import free_ports


def test_ports_are_distinct_bindable_below_the_ephemeral_range_and_skip_taken_ones():
    taken = {p for p in range(1024, ephemeral_port_range()[0]) if p % 2}  # every odd port is taken
    ports = free_ports(20, taken=taken)
    assert len(set(ports)) == 20
    assert all(p % 2 == 0 and p < ephemeral_port_range()[0] for p in ports)
    assert set(ports) <= taken  # recorded as taken now
    for p in ports:
        with socket.socket() as s:
            s.bind(("127.0.0.1", p))
