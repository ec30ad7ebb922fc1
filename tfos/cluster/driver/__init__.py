"""The Spark driver's side of the cluster: the public ``TFCluster`` (``api``) and what it is made
of (``lifecycle``, ``registry``, ``service``, ``spark``, ``settings``, ``progress``,
``tensorboard``, ``tracking``). Only the driver imports this package."""
