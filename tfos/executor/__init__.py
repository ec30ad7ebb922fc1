"""Code that runs in Spark tasks on the executors (Python workers): the barrier task that
launches a node agent (``bootstrap``) and the tasks that feed data to the nodes
(``feeding``). Never imports TensorFlow or driver modules."""
