"""The Spark driver's side of tfos: the public ``TFCluster`` (``cluster``) and what it is made of
(``lifecycle``, ``registry``, ``feed_scheduler``, ``service``, ``feeding``, ``spark``,
``progress``, ``tensorboard``). Only the driver imports this package."""
