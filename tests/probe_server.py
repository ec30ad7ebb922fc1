"""A control service and a feed hub in one process, for tests/integration/test_listener_probes.py.

Prints one line ``<control port> <feed port> <secret> <encrypt 0|1>`` and serves until stdin
closes. Arguments: the RLIMIT_NOFILE to run under (a low one provokes EMFILE in the accept loops)
and 1 for encrypted channels (default 0)."""

import resource
import sys
import threading

from tfos.feed.driver.scheduler import FeedScheduler
from tfos.cluster.driver.registry import NodeRegistry
from tfos.cluster.driver.service import ControlService
from tfos.feed.node.hub import FeedHub
from tfos.wire.channel import new_key


def main():
    nofile = int(sys.argv[1])
    resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))
    key = new_key(len(sys.argv) > 2 and sys.argv[2] == "1")
    registry = NodeRegistry("probe", [("chief", 0), ("worker", 0)])
    control = ControlService(registry, FeedScheduler(registry, [0, 1]).handlers(), key, "127.0.0.1").start()
    hub = FeedHub(key).start()
    queue = hub.queue("input")

    def drain():  # a reader, as main_fun would be: keeps legitimate feeds flowing
        while True:
            queue.q.get()

    threading.Thread(target=drain, daemon=True).start()
    print(control.port, hub.port, key.secret, int(key.encrypt), flush=True)
    sys.stdin.read()


if __name__ == "__main__":
    main()
