"""The TF process: one per node, started by the node agent (``python -m tfos.node``). Runs the
user's ``main_fun(args, ctx)``: ``runtime`` (start-up and rendezvous), ``context`` (``ctx``),
``hub`` and ``datafeed`` (InputMode.SPARK feed), ``reporting`` (progress and timeline).
Never imports driver modules."""
