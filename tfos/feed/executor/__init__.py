"""The feed's executor side: the feeding Spark task (``producer``) and how it gets the cluster's
secret (``credentials``). Never imports TensorFlow or driver modules."""
