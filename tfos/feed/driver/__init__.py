"""The feed's driver side: the feeding Spark jobs (``jobs``) and chunk scheduling (``scheduler``)."""
