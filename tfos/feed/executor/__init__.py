"""The feed's executor side: the feeding Spark task (``producer``). Never imports TensorFlow or
driver modules."""
