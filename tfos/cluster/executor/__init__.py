"""Code that runs in Spark tasks on the executors (Python workers): the barrier task that
launches a node agent (``bootstrap``) and ``TFParallel``'s task (``parallel``). Never imports
TensorFlow or driver modules."""
