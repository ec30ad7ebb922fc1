"""The Deadline object and the one slot wait built on it (reserve() at a fixed size and in a range,
the supervisor's restart), each look at a time on a fake clock: no thread, no sleep."""

import pytest

from tfos.cluster.driver import spark as S
from tfos.errors import ReservationTimeoutError
from tfos.host.deadline import Deadline


class Clock:
    """A monotonic clock that moves only when a pause says so; ``pauses`` records each sleep."""

    def __init__(self):
        self.now = 100.0
        self.pauses = []

    def __call__(self):
        return self.now

    def pause(self, secs):
        self.pauses.append(round(secs, 3))
        self.now += secs
        return False


def test_a_deadline_counts_down_on_its_clock_and_never_sleeps_past_itself():
    clock = Clock()
    d = Deadline(2.0, clock)
    assert (d.elapsed(), d.remaining(), d.expired(), d.slice(0.5)) == (0.0, 2.0, False, 0.5)
    clock.now += 1.8
    assert d.remaining() == pytest.approx(0.2) and d.slice(0.5) == pytest.approx(0.2) and not d.expired()
    clock.now += 0.2
    assert d.expired() and d.remaining() == 0.0 and d.slice(0.5) == 0.0
    clock.now += 5
    assert d.remaining() == 0.0 and d.elapsed() == pytest.approx(7.0)


# offered: what Spark offers at each look (the last one repeats); expected: the size returned, or
# the error; looks: how many times Spark was asked
SLOT_WAITS = [
    # (lo, hi, timeout, size_wait, offered, expected, looks)
    (2, 2, 10, 0, [2], 2, 1),  # a fixed size offered at once
    (2, 2, 10, 0, [None], 2, 1),  # this Spark cannot say: the barrier stage waits for the slots itself
    (2, 2, 10, 0, [0, 1, 3], 2, 3),  # executors still starting: at most hi
    (2, 2, 1.2, 0, [1], "Spark offers 1", 4),  # never enough: 3 slices of 0.5, 0.5, 0.2, then the error
    (2, 4, 10, 3, [3], 3, 7),  # a range: 3 of 4 offered, taken once size_wait (3 s) passed
    (2, 4, 10, 3, [2, 2, 4], 4, 3),  # all 4 before size_wait: at once
    (2, 4, 10, 0, [2], 2, 1),  # no size_wait (a restart): what is offered, at least lo
    (3, 4, 2, 0, [1, 2], "Spark offers 2", 5),  # below lo until the timeout: the last offer is named
]


@pytest.mark.parametrize("lo,hi,timeout,size_wait,offered,expected,looks", SLOT_WAITS)
def test_the_slot_wait_one_look_at_a_time(lo, hi, timeout, size_wait, offered, expected, looks):
    clock, asked = Clock(), []

    def offers():
        asked.append(clock.now)
        return offered[min(len(asked), len(offered)) - 1]

    def wait():
        return S.wait_for_size(offers, lo, hi, timeout, size_wait, clock=clock, pause=clock.pause,
                               why=lambda slots, secs: f"Spark offers {slots} after {secs:.1f}s")

    if isinstance(expected, str):
        with pytest.raises(ReservationTimeoutError, match=expected):
            wait()
        assert clock.now - 100.0 == pytest.approx(timeout)  # it gave up at the deadline, not a slice later
    else:
        assert wait() == expected
    assert len(asked) == looks and all(p <= S.SLOT_POLL_SECS for p in clock.pauses), (asked, clock.pauses)


def test_a_pause_that_says_the_cluster_ended_stops_the_wait_with_none():
    clock = Clock()
    ends = iter([False, True])
    assert S.wait_for_size(lambda: 1, 2, 4, 60, clock=clock, pause=lambda secs: next(ends)) is None


def test_the_default_error_names_min_executors_and_reservation_timeout():
    with pytest.raises(ReservationTimeoutError, match=r"cannot reserve min_executors=3 executors: Spark offers 1 "
                                                      r"concurrent task slot\(s\) after waiting 0s \(reservation_timeout\)"):
        S.wait_for_size(lambda: 1, 3, 4, 0)
