"""What to change, for failures of main_fun whose own message says something else (TF process).

``hint(traceback_text)`` is pure: it recognizes a known failure in a traceback and returns one
line that names the cause and the fix, or "". The TF process appends it to the traceback it
reports, so the driver's error carries it.
"""

from __future__ import annotations

import re

#: (pattern in the traceback, the line to add)
HINTS: tuple[tuple[re.Pattern, str], ...] = (
    # the message spans lines (the PerReplica's repr), and a script's error shows only its last lines
    (re.compile(r"Attempt to convert a value \(PerReplica|PerReplica:\{.*\} with an unsupported type|"
                r"with an unsupported type \(<class 'tensorflow\.python\.distribute\.values\.PerReplica'>\)"),
     "tfos hint: Keras 3's model.fit cannot run under tf.distribute.MultiWorkerMirroredStrategy (ctx.strategy()): "
     "Keras 3 has no multi-worker support (keras-team/keras#20585). Either drop the strategy scope and use "
     "tfos.keras_dist (rank, size = keras_dist.init_collectives(); optimizer=keras_dist.DistributedOptimizer(...); "
     "callbacks=[keras_dist.BroadcastInitialWeights(0)]), or use tf_keras under the strategy: pip install tf-keras "
     "and reserve(..., env={'TF_USE_LEGACY_KERAS': '1'})."),
    (re.compile(r"Collective ops must be configured at program startup"),
     "tfos hint: TensorFlow configures its collectives once, before its first op: call ctx.strategy() (or create "
     "the MultiWorkerMirroredStrategy) before any other TensorFlow call in main_fun or the script, e.g. before "
     "building datasets or reading files with tf.io."),
)


def hint(text: str) -> str:
    """Pure: the hint line for the first known failure found in ``text``, else ""."""
    for pattern, line in HINTS:
        if pattern.search(text):
            return line
    return ""
