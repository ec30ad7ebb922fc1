"""The driver's control service: the TCP endpoint agents, TF processes and feeding tasks talk
to (runs on the driver). Requests are typed messages dispatched by type to the node registry
and to the handlers the cluster adds (the feed scheduler's: ``FeedScheduler.handlers()``, passed
in by ``tfos.api``, so this package does not import the feed); one reply each. No Arrow frames
are accepted on this channel.

After its first request a connection is parked (``wire.listener.Parking``): one thread waits on
every idle connection and answers the quick requests itself (a heartbeat, a report, a
registration: a lock and a dict update); a request that may wait (the cluster spec, a gate, a
gather, a store read, a save poll) gets a thread of its own. Thousands of nodes' heartbeats and
reports then cost no thread each and no hand-over of the GIL per request."""

from __future__ import annotations

import errno
import logging

from tfos.cluster.driver.registry import NodeRegistry
from tfos.errors import ChannelClosed, ConfigError, ProtocolError
from tfos.host import limits
from tfos.wire import messages as M
from tfos.wire.channel import Channel
from tfos.wire.listener import Listener, Parking

logger = logging.getLogger(__name__)

#: requests answered by the parking thread itself: they take a lock and change a few fields, never
#: wait (a report is one too unless it carries MLflow history or printed lines for the console)
QUICK = frozenset({M.Heartbeat, M.AgentStarted, M.RegisterNode, M.NodeExited, M.NodeStacks, M.LogModel,
                   M.NodeResult, M.CheckpointSaved, M.AssignChunk, M.FeedTerminated, M.FeedPosition, M.StoreSet,
                   M.StoreAdd, M.StoreCompareSet, M.StoreDelete})


#: the two replies of nearly every request (a report's, a heartbeat's with nothing to ask), encoded once
_ACK = M.Encoded(M.Ack())
_GO_ON = M.Encoded(M.HeartbeatReply(stop=False))


def waits(msg) -> bool:
    """Pure: whether answering ``msg`` may block (a long poll, or a call out to MLflow or the
    console): it then gets a thread of its own instead of the parking thread."""
    if type(msg) is M.Report:
        return bool(msg.history or msg.output)
    return type(msg) not in QUICK


class ControlService:
    def __init__(self, registry: NodeRegistry, handlers: dict, key: M.ChannelKey, bind_host: str = "0.0.0.0",
                 port: int = 0):
        self.registry = registry
        self.handlers = {
            M.RegisterNode: registry.on_register,
            M.GetClusterSpec: registry.on_cluster_spec,
            M.AgentStarted: registry.on_agent_started,
            M.Heartbeat: registry.on_heartbeat,
            M.NodeStacks: registry.on_node_stacks,
            M.Gather: registry.on_gather,
            M.NodeExited: registry.on_node_exited,
            M.Report: registry.on_report,
            M.LogModel: registry.on_log_model,
            M.NodeResult: registry.on_node_result,
            M.CheckpointSaved: registry.on_checkpoint_saved,
            M.EvictionNotice: registry.saves.on_notice,
            M.SavePoll: registry.saves.on_poll,
            M.GetNodeFailure: registry.on_get_node_failure,
            M.StoreSet: registry.on_store_set,
            M.StoreGet: registry.on_store_get,
            M.StoreAdd: registry.on_store_add,
            M.StoreCompareSet: registry.on_store_compare_set,
            M.StoreDelete: registry.on_store_delete,
        }
        self.handlers.update(handlers)
        connections, backlog, handshake = limits.listener_sizes(len(registry.roles))
        self._listener = Listener(key, self._serve, f"control-{registry.cluster_id}", bind_host,
                                  max_data_frame=0, port=port, max_connections=connections, backlog=backlog,
                                  handshake_timeout=handshake)
        self.port = self._listener.port
        self._parking = Parking(self._listener, self._reply, waits, self._closed)

    def start(self) -> "ControlService":
        self._listener.start()
        return self

    def stop(self) -> None:
        self._listener.close()
        self._parking.close()

    def handle(self, msg):
        """The reply to one request."""
        handler = self.handlers.get(type(msg))
        if handler is None:
            return M.ErrorReply(f"the driver does not accept {type(msg).__name__}")
        if msg.cluster_id != self.registry.cluster_id:
            return M.ErrorReply(f"message for cluster {msg.cluster_id}, this is {self.registry.cluster_id}")
        try:
            return handler(msg)
        except ProtocolError as e:
            return M.ErrorReply(str(e))
        except Exception as e:  # never let a handler bug kill the service
            logger.exception("tfos control service failed on %s", type(msg).__name__)
            return M.ErrorReply(f"driver error: {e}")

    def _serve(self, ch: Channel):
        """A new connection's first request; then it waits parked for the next."""
        state: dict = {}  # "agent": (cluster id, node index) whose heartbeats this connection carries
        try:
            try:
                msg = ch.recv()
            except ChannelClosed:
                return None
            except ProtocolError as e:  # answered (by the listener), then closed: framing may be lost
                raise ProtocolError(f"bad request: {e}") from None
            ch.send(self._reply(ch, state, msg))
        except BaseException:
            self._closed(state)
            raise
        return self._parking.park(ch, state)

    def _reply(self, ch: Channel, state: dict, msg):
        reply = self.handle(msg)
        if type(reply) is M.HeartbeatReply:
            if type(msg) is M.Heartbeat:
                state["agent"] = (msg.cluster_id, msg.node_index)
            if not reply.stop and not reply.dump:
                return _GO_ON
        elif type(reply) is M.Ack:
            return _ACK
        return reply

    def _closed(self, state: dict) -> None:
        """However a connection ended: an agent that does not come back soon is gone
        (lifecycle.agent_lost)."""
        agent = state.get("agent")
        if agent is not None:
            self.registry.on_agent_disconnected(*agent)


def listen(registry: NodeRegistry, handlers: dict, key: M.ChannelKey, address) -> "ControlService":
    """The started control service, on the first free port of ``address.ports``. First the open-file
    limit is raised for the cluster's nodes (ConfigError naming ``ulimit -n`` when it cannot be)."""
    limits.ensure_open_files(len(registry.roles))
    ports = address.ports or (address.port,)
    error: OSError | None = None
    for port in ports:
        try:
            return ControlService(registry, handlers, key, address.bind, port).start()
        except OSError as e:
            error = e
            if e.errno not in (errno.EADDRINUSE, errno.EACCES):  # the address itself is wrong: stop here
                break
    where = f"{address.bind}:{'-'.join(map(str, sorted({ports[0], ports[-1]})))}"
    fix = f"set {address.bind_setting} to an address of this machine"
    if ports != (0,):
        fix += " and TFOS_SERVER_PORT to a free port or range"
    raise ConfigError(f"the driver's control service cannot listen on {where}: {error}; {fix}") from None
