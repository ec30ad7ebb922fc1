"""A training rank's SavePoint (ctx.should_checkpoint / ctx.checkpoint_saved) against a driver that
answers its polls as the driver's save rounds do: a round opens, each rank proposes, the target is
the highest proposal."""

import threading
import time

from tfos.cluster.node.saving import SavePoint
from tfos.wire import messages as M


class Rounds:
    """The driver's side for one rank: round 1 opens when ``open`` is set; its target is this
    rank's proposal once made (one rank: the highest is its own)."""

    def __init__(self):
        self.open = threading.Event()
        self.polls = []

    def save_poll(self, step, rnd, proposal, target, wait):
        self.polls.append((step, rnd, proposal, target))
        if not self.open.is_set():
            self.open.wait(min(wait, 0.05))
            return M.SaveReply(0, -1)
        return M.SaveReply(1, proposal if rnd == 1 and proposal >= 0 else -1)


def wait_for(check, timeout=5.0):
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def run_steps(point, steps, periodic, out, stop_after_save=None):
    """The docs' loop: ``if step % periodic == 0 or should_checkpoint(step)``: save, checkpoint_saved."""
    for step in steps:
        if step % periodic == 0 or point.check(step):
            out.append(("saved", step))
            point.after_save(step)
            if stop_after_save is not None and stop_after_save.is_set():
                return
        out.append(("done", step))


def test_a_round_opened_during_a_periodic_save_is_served_by_it_and_no_step_follows():
    """The rank finished step 74 (its last should_checkpoint), a round opens while it does step 75,
    which the program saves without asking (75 % 25 == 0): it proposed 75, so that save serves the
    round, and checkpoint_saved(75) waits for the stop instead of going on to step 76."""
    rounds = Rounds()
    point = SavePoint(rounds, grace=20.0)
    out = []
    run_steps(point, range(70, 75), 25, out)  # should_checkpoint(70..74): no round
    assert ("saved", 70) not in out and point.last == 74
    rounds.open.set()
    assert wait_for(lambda: point.proposal == 75), point.proposal  # the step after the last it was told of
    stopped = threading.Event()
    t = threading.Thread(target=run_steps, args=(point, range(75, 80), 25, out, stopped))
    t.start()
    assert wait_for(lambda: ("saved", 75) in out)
    time.sleep(0.5)
    assert t.is_alive() and ("done", 75) not in out, out  # waiting for the stop at the save
    stopped.set()
    point.close()  # the driver stops this process
    t.join(5)
    assert out[-1] == ("saved", 75), out


def test_a_save_short_of_the_proposal_does_not_serve_the_round():
    """A round opens after should_checkpoint(80): the rank proposes 81; its save at 80 (taken for a
    reason of its own) is short of it and goes on; should_checkpoint(81) is then True."""
    rounds = Rounds()
    point = SavePoint(rounds, grace=20.0)
    assert point.check(80) is False
    rounds.open.set()
    assert wait_for(lambda: point.proposal == 81)
    started = time.monotonic()
    point.after_save(80)
    assert time.monotonic() - started < 1.0  # did not wait
    assert wait_for(lambda: point.target == 81)
    assert point.check(81) is True
    point.close()


def test_with_tfs_handler_a_save_of_the_program_does_not_wait():
    """TF's preemption handler agrees on the step (proposal 0): the program's own checkpoint_saved
    does not take the round (the handler's save does) and returns at once."""
    rounds = Rounds()
    heard = []
    point = SavePoint(rounds, grace=20.0, on_round=heard.append)
    point.start()
    rounds.open.set()
    assert wait_for(lambda: heard == [1])
    started = time.monotonic()
    point.after_save(10)
    assert time.monotonic() - started < 1.0 and point.saved_round == 0
    point.close()
