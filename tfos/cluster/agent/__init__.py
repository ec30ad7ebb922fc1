"""The node agent: one per node, a detached process started by the Spark barrier task
(``python -m tfos.cluster.agent``). It owns the node's TF process (``node_agent``), its process
tree (``reaper``) and its GPUs (``tfos.host.gpus``). Imports neither pyspark nor TensorFlow nor
any driver module."""
