"""A feeding task's connections to the nodes it feeds (Spark task side; never imports TensorFlow):
one channel per node, the node's shared-memory ring where it is on this host (:mod:`tfos.wire.ring`),
per-node row counts, the schema check of the partition's chunks, the gate's safe counts and the
partition's end. :mod:`tfos.feed.executor.producer` decides what goes where.
"""

from __future__ import annotations

import logging
import socket

import pyarrow as pa

from tfos.errors import ChannelClosed, FeedError, FeedTimeoutError, ProtocolError, RequestRefused
from tfos.wire import arrow
from tfos.wire import messages as M
from tfos.wire import ring
from tfos.wire.clients import FeedClient

logger = logging.getLogger(__name__)


class SendFailed(FeedError):
    """A send to ``node`` failed: the caller asks the driver to place the rows again."""

    def __init__(self, node: int, message: str):
        super().__init__(message)
        self.node = node


class Sender:
    """One partition's connections to the nodes it feeds, with per-node row counts."""

    def __init__(self, cfg: M.FeedConfig, partition: int, train: bool):
        self.cfg = cfg
        self.partition = partition
        self.train = train
        self.clients: dict[int, FeedClient] = {}
        self.rows: dict[int, int] = {}
        self.schema: pa.Schema | None = None
        self.rows_checked = 0
        # a gated train feed (equal steps): each node hears the driver's safe count with its data
        self.gated = train and bool(cfg.uneven) and len(cfg.feed_nodes) > 1
        self.safe_sent: dict[int, int] = {}
        self.rings: dict[int, ring.RingWriter] = {}  # nodes on this host that lent a shared-memory ring

    def client(self, node: int) -> FeedClient:
        client = self.clients.get(node)
        if client is None:
            host, port = self.cfg.address(node)
            local = self.cfg.shared_memory and _is_local(host)
            try:
                client = FeedClient(node, host, port, self.cfg.key, self.cfg.feed_timeout)
                offer = client.begin(self.cfg.feed_id, self.cfg.qname, self.partition, self.train, self.cfg.uneven,
                                     len(self.cfg.feed_nodes), local=local,
                                     mapped=ring.mapped_tokens() if local else ())
            except (OSError, ProtocolError, RequestRefused) as e:
                raise SendFailed(node, f"cannot feed node {node} at {host}:{port}: {e}") from None
            self.clients[node] = client
            self.rows[node] = 0
            if offer is not None:
                self._map_ring(node, offer)
        return client

    def _map_ring(self, node: int, offer: M.FeedRing) -> None:
        """Write this connection's chunks into the ring node ``node`` lent, if it can be mapped;
        the log says which path the chunks take (once per path and worker)."""
        why = offer.why
        if offer.pid:
            try:
                self.rings[node] = ring.RingWriter(offer)
                _log_path(f"node {node}'s shared-memory ring")
                return
            except (OSError, ProtocolError) as e:
                why = f"its ring cannot be mapped here: {e}"
        _log_path(f"the channel to node {node} ({why})")

    def staging(self, node: int):
        """``alloc`` for :func:`tfos.wire.arrow.rows_to_batch` that converts a chunk bound for
        ``node`` into a slot of the ring it lent (None when it lent none, or cannot be reached:
        the send then says so)."""
        try:
            self.client(node)
        except SendFailed:
            return None
        writer = self.rings.get(node)
        return writer.stage if writer is not None else None

    def drop(self, node: int) -> None:
        self.safe_sent.pop(node, None)
        writer = self.rings.pop(node, None)
        if writer is not None:
            writer.forget()
        client = self.clients.pop(node, None)
        if client is not None:
            client.close()

    def check(self, batch: pa.RecordBatch) -> None:
        """FeedError naming the partition, row and column when this partition's rows change shape."""
        if self.schema is None:
            self.schema = batch.schema
            return
        drift = arrow.schema_drift(self.schema, batch.schema)
        if drift:
            raise FeedError(f"partition {self.partition}, row {self.rows_checked}: {drift}")

    def send(self, node: int, batch: pa.RecordBatch, safe: int = 0, at: tuple | None = None) -> None:
        """One piece to ``node``; in a gated feed, preceded by the driver's ``safe`` count when it
        rose since this connection last carried it (the node's reader then need not ask); in a
        resumable feed, by where its rows come from (``at``: epoch, partition, offset)."""
        self.check(batch)
        client = self.client(node)
        try:
            if self.gated and safe > self.safe_sent.get(node, 0):
                client.send_safe(safe)
                self.safe_sent[node] = safe
            if at is not None:
                client.send_at(*at)
            parts = arrow.ipc_parts(batch)
            placed = self.rings[node].put(parts) if node in self.rings else None
            if placed is not None:
                client.send_shm(*placed)
            else:
                client.send_batch(parts)
        except socket.timeout:
            raise FeedTimeoutError(
                f"node {node} accepted no data for {self.cfg.feed_timeout:.0f}s while feeding partition "
                f"{self.partition} (raise feed_timeout, or check that main_fun keeps reading its feed)") from None
        except (OSError, ChannelClosed) as e:
            refused = client.refusal()
            if refused:  # the hub said why it closed the feed (e.g. this partition's columns drift)
                raise FeedError(refused) from None
            raise SendFailed(node, f"feeding partition {self.partition} to node {node} failed: {e} (the node's "
                                    "TF process may have died; the driver reports its log)") from None
        self.rows[node] += batch.num_rows
        self.rows_checked += batch.num_rows

    def announce(self, safe: int) -> None:
        """The driver's ``safe`` count to every node this partition feeds that has not heard it: a
        node learns that its rows are readable when another node is sent the chunk that makes
        them so. Only to a connection that takes it without blocking (news is an optimisation: a
        node without it asks the driver); one that fails here is left to the next send or
        ``finish`` to report."""
        if not self.gated:
            return
        for node, client in self.clients.items():
            if safe > self.safe_sent.get(node, 0) and client.writable():
                try:
                    client.send_safe(safe)
                except (OSError, ChannelClosed):
                    continue
                self.safe_sent[node] = safe

    def finish(self, finished_reading=lambda node: False) -> None:
        for node, client in self.clients.items():
            try:
                client.end_partition(self.rows[node])
                ack = client.next_reply()
            except socket.timeout:
                raise FeedTimeoutError(f"node {node} did not confirm partition {self.partition} within "
                                       f"{self.cfg.feed_timeout:.0f}s (raise feed_timeout)") from None
            except RequestRefused as e:
                raise FeedError(str(e)) from None
            except (OSError, ProtocolError) as e:
                if finished_reading(node):
                    continue
                raise FeedError(f"node {node} dropped the feed of partition {self.partition}: {e}") from None
            if isinstance(ack, M.FeedAck) and ack.terminated:
                continue
            if not isinstance(ack, M.FeedAck) or ack.rows != self.rows[node]:
                raise FeedError(f"node {node} acknowledged {getattr(ack, 'rows', ack)} of {self.rows[node]} rows "
                                f"of partition {self.partition}")

    def close(self) -> None:
        for writer in self.rings.values():
            writer.close()
        for client in self.clients.values():
            client.close()


_local_hosts: dict[str, bool] = {}
_paths_logged: set[str] = set()


def _is_local(host: str) -> bool:
    """Whether the TF process at ``host`` runs on this host (remembered per worker)."""
    if host not in _local_hosts:
        _local_hosts[host] = ring.is_local(host)
    return _local_hosts[host]


def _log_path(path: str) -> None:
    if path not in _paths_logged:
        _paths_logged.add(path)
        logger.info("tfos feed: this worker sends chunks through %s", path)
