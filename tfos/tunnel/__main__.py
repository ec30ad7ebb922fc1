"""``python -m tfos.tunnel build|path``: see :mod:`tfos.tunnel.build`."""

import logging

from tfos.tunnel.build import main

if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    raise SystemExit(main())
