"""What crosses a process boundary: typed messages and configurations (``messages``), the
authenticated framed channel (``channel``), the listener every tfos server uses
(``listener``), the typed clients (``clients``) and Arrow rows/frames (``arrow``).

Used by every process; imports neither pyspark nor TensorFlow.
"""
