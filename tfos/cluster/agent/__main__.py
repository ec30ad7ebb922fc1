"""``python -m tfos.cluster.agent``: the node agent, with its NodeConfig as one encoded line on stdin."""

from tfos.cluster.agent.node_agent import main

if __name__ == "__main__":
    raise SystemExit(main())
