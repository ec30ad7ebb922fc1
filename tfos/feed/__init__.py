"""The data path of InputMode.SPARK, from ``cluster.train(df)`` to ``feed.dataset()`` in a TF
process. One module or sub-package per process:

* ``driver``: the feeding Spark jobs and the end of feeds (``jobs``), which rank takes the next
  chunk (``scheduler``, in the control service);
* ``executor``: the feeding task that turns partitions into Arrow record batches and streams
  them to the ranks (``producer``);
* ``arrow``: rows to Arrow and the framing on the wire (shared by the feeding task and the TF
  process);
* ``node``: in the TF process, the feed hub that receives the frames (``hub``), the user's
  ``DataFeed`` (``datafeed``) and ``TFManager``'s in-process queues (``manager``).
"""
