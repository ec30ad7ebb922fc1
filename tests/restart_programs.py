"""main_funs of the restart tests, shared by the local-cluster suite (tests/integration) and the
multi-host suite (tests/multihost)."""

import json
import os
import signal
import tempfile
import time

from tfos.errors import Cause


def _restored_mwms_model(ctx):
    """A small MWMS model and optimizer restored from ctx.checkpoint_dir (rank 0 saves there, the
    others in a directory of their own): ``(model, opt, manager, resumed_from, step)``, ``step(x)``
    one training step on a batch ``x`` of shape (rows, 16), ones by default."""
    import keras
    import tensorflow as tf

    strategy = ctx.strategy()
    with strategy.scope():
        model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(8)])
        opt = keras.optimizers.SGD(0.01)
        opt.build(model.trainable_variables)
    ckpt = tf.train.Checkpoint(model=model, optimizer=opt)
    save_dir = ctx.checkpoint_dir if ctx.is_chief else tempfile.mkdtemp(prefix="ckpt-")
    manager = tf.train.CheckpointManager(ckpt, save_dir, max_to_keep=2)
    latest = tf.train.latest_checkpoint(ctx.checkpoint_dir)
    if latest:
        ckpt.restore(latest).assert_existing_objects_matched()

    @tf.function
    def step(x):
        def replica(x):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(tf.square(model(x)))
            opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
        strategy.run(replica, args=(x,))

    ones = tf.ones((4, 16))
    return model, opt, manager, int(opt.iterations.numpy()), lambda x=None: step(ones if x is None else x)


def _write_result(args, ctx, model, opt, resumed_from, first) -> None:
    """What this rank did in this attempt: ``attempt-rank<rank>.json`` in ``args['out']``."""
    with open(os.path.join(args["out"], f"attempt-rank{ctx.rank}.json"), "w") as f:
        json.dump({"attempt": ctx.attempt, "resumed_from": resumed_from, "steps": int(opt.iterations.numpy()),
                   "first_step_time": first, "host": ctx.host,
                   "weights": [w.numpy().tolist() for w in model.weights]}, f)


def evictable_steps(args, ctx):
    """MWMS training steps up to ``args['steps']``, checkpointed when ctx.should_checkpoint says so
    (a node must go; unless ``args['ask']`` is False) and every ``args['every']`` steps (0: never),
    restored from ctx.checkpoint_dir on a restart; each rank records the last step it finished
    after every step (``last-a<attempt>-r<rank>``), and what it did. bench/restart.py --evict runs
    it too."""
    every, ask = args.get("every", 0), args.get("ask", True)
    model, opt, manager, resumed_from, step = _restored_mwms_model(ctx)
    first, saved = None, []
    last = os.path.join(args["out"], f"last-a{ctx.attempt}-r{ctx.rank}")
    while int(opt.iterations.numpy()) < args["steps"]:
        step()
        i = int(opt.iterations.numpy())
        with open(last, "w") as f:
            f.write(str(i))
        if first is None:
            first = time.time()
            ctx.report(first_step_time=first, attempt=ctx.attempt, resumed_from=resumed_from)
        ctx.report(step=i)
        if (every and i % every == 0) or (ask and ctx.should_checkpoint(i)):
            manager.save(checkpoint_number=i)
            saved.append(i)
            record = os.path.join(args["out"], f"saved-a{ctx.attempt}-r{ctx.rank}.json")
            with open(record + ".tmp", "w") as f:
                json.dump(saved, f)
            os.replace(record + ".tmp", record)  # whole or absent, whenever the host dies
            ctx.checkpoint_saved(i)  # every rank: after a save for an eviction it waits here for the restart
        time.sleep(0.05)
    _write_result(args, ctx, model, opt, resumed_from, first)


def fed_steps(args, ctx):
    """MWMS steps on fed rows (InputMode.SPARK, rows ``(id, x)``), ``args['batch']`` per rank per
    step, checkpointed every ``args['every']`` steps with ``ctx.checkpoint_saved`` on every rank
    (which sends the feed's position) and restored from ctx.checkpoint_dir on a restart. Each rank
    appends ``[step, ids]`` after every step to ``ids-a<attempt>-r<rank>.jsonl`` in ``args['out']``
    (its first line: ``{"resumed_from": step}``): :func:`trained_ids` rebuilds what the final
    model trained on from them. ``args['kill']``: ``[node_index, step]``, that node's TF process
    SIGKILLs itself once it has logged that step in attempt 0 (a failure at an exact step)."""
    import numpy as np
    import tensorflow as tf

    model, opt, manager, resumed_from, step = _restored_mwms_model(ctx)
    feed = ctx.get_data_feed()
    log = open(os.path.join(args["out"], f"ids-a{ctx.attempt}-r{ctx.rank}.jsonl"), "w")
    log.write(json.dumps({"resumed_from": resumed_from}) + "\n")
    log.flush()
    first = None
    while not feed.should_stop():
        rows = feed.next_batch(args["batch"])
        if not rows:
            continue
        ids = [int(r[0]) for r in rows]
        step(tf.constant(np.tile(np.array(ids, np.float32)[:, None] / 1e4, (1, 16))))
        i = int(opt.iterations.numpy())
        log.write(json.dumps([i, ids]) + "\n")
        log.flush()
        if first is None:
            first = time.time()
            ctx.report(first_step_time=first, attempt=ctx.attempt, resumed_from=resumed_from)
        ctx.report(step=i)
        if ctx.attempt == 0 and [ctx.node_index, i] == args.get("kill"):
            os.kill(os.getpid(), signal.SIGKILL)
        if i % args["every"] == 0 or ctx.should_checkpoint(i):
            manager.save(checkpoint_number=i)
            ctx.checkpoint_saved(i)  # every rank: the feed's position at this checkpoint goes to the driver
        time.sleep(args.get("sleep", 0.0))
    log.close()
    _write_result(args, ctx, model, opt, resumed_from, first)


def trained_ids(out, before: int | None = None) -> list[int]:
    """The ids the final model trained on, from every attempt's ``ids-a*-r*.jsonl`` (fed_steps):
    attempt a's steps count from where it resumed up to where every later attempt resumed from
    (the steps after a checkpoint that a restart went back to are undone). ``before``: only what
    attempt ``before`` resumed with (its checkpoint's ids)."""
    import glob
    import re

    attempts: dict[int, list] = {}
    for path in glob.glob(os.path.join(out, "ids-a*-r*.jsonl")):
        a = int(re.search(r"ids-a(\d+)-r", path).group(1))
        with open(path) as f:
            lines = [json.loads(line) for line in f if line.strip()]
        attempts.setdefault(a, []).append((lines[0]["resumed_from"], lines[1:]))
    resumed = {a: min(r for r, _ in ranks) for a, ranks in attempts.items()}
    ids = []
    for a, ranks in attempts.items():
        if before is not None and a >= before:
            continue
        cutoff = min((resumed[b] for b in resumed if b > a), default=float("inf"))
        for _r, lines in ranks:
            ids.extend(i for step, batch in lines if step <= cutoff for i in batch)
    return ids


def ps_checkpointed_steps(args, ctx):
    """Parameter servers (runs on the chief): steps scheduled through a ClusterCoordinator in
    rounds of 5, checkpointed after each round in ctx.checkpoint_dir (the variables live on the
    ps nodes) and restored from it on a restart; writes what this attempt did."""
    import keras
    import tensorflow as tf

    strategy = ctx.strategy()
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    with strategy.scope():
        model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(8)])
        opt = keras.optimizers.SGD(0.01)
        opt.build(model.trainable_variables)
    ckpt = tf.train.Checkpoint(model=model, optimizer=opt)
    manager = tf.train.CheckpointManager(ckpt, ctx.checkpoint_dir, max_to_keep=2)
    if manager.latest_checkpoint:
        ckpt.restore(manager.latest_checkpoint).assert_existing_objects_matched()
    resumed_from = int(opt.iterations.numpy())

    @tf.function
    def step_fn():
        def replica():
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(tf.square(model(tf.ones((4, 16)))))
            opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
        strategy.run(replica)

    first = None
    while int(opt.iterations.numpy()) < args["steps"]:
        for _ in range(5):
            coordinator.schedule(step_fn)
        coordinator.join()
        i = int(opt.iterations.numpy())
        if first is None:
            first = time.time()
        manager.save(checkpoint_number=i)
        ctx.report(step=i, attempt=ctx.attempt)
        time.sleep(0.05)
    with open(os.path.join(args["out"], "ps-chief.json"), "w") as f:
        json.dump({"attempt": ctx.attempt, "resumed_from": resumed_from, "steps": int(opt.iterations.numpy()),
                   "first_step_time": first}, f)


def kill_rank_1_at_half_and_check(cluster, planned: int, out) -> list[dict]:
    """Restart tests with TENSORFLOW-mode digits: SIGKILL node 1's TF process once every node
    reported ``planned // 2`` steps, wait for the run, and check the restart: attempt 1 on every
    rank, the planned step count (resumed, not redone). Returns the ranks' attempt records."""
    import signal

    from tfos.testing import wait_for

    assert wait_for(lambda: min(m.get("step", 0) for m in cluster.metrics().values()) >= planned // 2, 600,
                    interval=0.02)
    os.kill(cluster.nodes[1]["pid"], signal.SIGKILL)
    cluster.shutdown(timeout=900)
    # the killed node is among the causes (its peer's collective may have failed first)
    assert cluster.attempt == 1 and {r.attempt for r in cluster.restarts} == {0}
    assert any(r.node_index == 1 and r.cause is Cause.KILLED and "killed by signal 9" in r.reason
               for r in cluster.restarts), cluster.restarts
    ranks = [json.loads((out / f"attempt-rank{r}.json").read_text()) for r in range(2)]
    assert all(r["attempt"] == 1 for r in ranks)
    assert all(r["steps"] == planned for r in ranks), ranks  # the planned count, not planned plus a redo
    return ranks
