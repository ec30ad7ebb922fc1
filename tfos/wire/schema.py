"""Schema drift between fed chunks, decided on typed column descriptions (pure; no pyarrow).

The feeding tasks, the nodes' feed hubs and the driver all use :func:`column_drift`, so a feed
whose rows change shape fails with the same message wherever the change is seen first.
"""

from __future__ import annotations

from tfos.wire.messages import Column


def _describe(c: Column) -> str:
    return c.type + (f" of shape ({c.shape})" if c.shape else "")


def column_drift(first: tuple[Column, ...], columns: tuple[Column, ...]) -> str | None:
    """How ``columns`` differ from the ``first`` columns of the same feed, or None.

    Numbers may widen (ints then floats); a column whose kind changes (number then string), a
    vector whose length or shape changes, and a column that appears or disappears are drift."""
    names = [c.name for c in columns]
    first_names = [c.name for c in first]
    if names != first_names:
        extra = [n for n in names if n not in first_names]
        missing = [n for n in first_names if n not in names]
        if extra:
            return f"column {extra[0]!r} appears (the feed began with columns {first_names})"
        if missing:
            return f"column {missing[0]!r} is missing (the feed began with columns {first_names})"
        return f"columns are reordered: {names}, the feed began with {first_names}"
    for a, b in zip(first, columns):
        if a.kind != b.kind or a.shape != b.shape:
            return f"column {a.name!r} holds {_describe(b)}, but earlier rows of this feed hold {_describe(a)}"
    return None
