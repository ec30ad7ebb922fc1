"""Moved to :mod:`tfos.wire.arrow`; this name remains until the feed code moves too."""

from tfos.wire.arrow import (ROW_KIND, SHAPE, batch_to_rows, column_to_numpy, from_ipc,  # noqa: F401
                             results_to_batch, rows_to_batch, to_ipc)
