"""A control service and a feed hub in one process, for tests/integration/test_listener_probes.py.

Prints one line ``<control port> <feed port> <secret>`` and serves until stdin closes. Argument:
the RLIMIT_NOFILE to run under (a low one provokes EMFILE in the accept loops)."""

import resource
import sys
import threading

from tfos.feed.driver.scheduler import FeedScheduler
from tfos.cluster.driver.registry import NodeRegistry
from tfos.cluster.driver.service import ControlService
from tfos.feed.node.hub import FeedHub
from tfos.wire.channel import new_secret


def main():
    nofile = int(sys.argv[1])
    resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))
    secret = new_secret()
    registry = NodeRegistry("probe", [("chief", 0), ("worker", 0)])
    control = ControlService(registry, FeedScheduler(registry, [0, 1]), secret, "127.0.0.1").start()
    hub = FeedHub(secret).start()
    queue = hub.queue("input")

    def drain():  # a reader, as main_fun would be: keeps legitimate feeds flowing
        while True:
            queue.q.get()

    threading.Thread(target=drain, daemon=True).start()
    print(control.port, hub.port, secret, flush=True)
    sys.stdin.read()


if __name__ == "__main__":
    main()
