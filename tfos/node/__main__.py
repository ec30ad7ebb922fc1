"""``python -m tfos.node``: the TF process, with its NodeConfig as one encoded line on stdin."""

from tfos.node.runtime import main

if __name__ == "__main__":
    main()
