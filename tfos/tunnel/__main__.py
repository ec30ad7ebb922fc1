"""``python -m tfos.tunnel build|path``: see :mod:`tfos.tunnel.build`."""

from tfos.host.builds import run_command
from tfos.tunnel.build import main

if __name__ == "__main__":
    run_command(main)
