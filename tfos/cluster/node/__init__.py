"""The TF process: one per node, started by the node agent (``python -m tfos.cluster.node``). Runs
the user's ``main_fun(args, ctx)``: ``runtime`` (start-up and rendezvous), ``context`` (``ctx``),
``reporting`` (progress and timeline), ``script`` (unchanged TF scripts). Its feed is in
:mod:`tfos.feed.node`. Never imports driver modules."""
