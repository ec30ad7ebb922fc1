"""Host-local helpers of the processes on an executor host (barrier task, node agent, TF
process) and of the driver's children: process supervision (``processes``) and the host-wide
claim registry for GPUs and ports (``claims``). No pyspark, no TensorFlow."""
