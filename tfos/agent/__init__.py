"""The node agent: one per node, a detached process started by the Spark barrier task
(``python -m tfos.agent``). It owns the node's TF process (``supervisor``) and picks its GPUs
(``gpus``). Imports neither pyspark nor TensorFlow nor any driver module."""
