"""Data feeding for InputMode.SPARK (``producer``: Spark tasks; ``consumer``: TF process;
``driver_side``: the driver)."""
