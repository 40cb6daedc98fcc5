"""A fault proxy on the client→broker path that can swallow the broker's answers to produce requests.

Each broker has a listener (FAULTY) that advertises ``layout.proxy_port(n)``; the proxy listens
there and forwards to ``layout.faulty_port(n)``. It reads Kafka's framing (4-byte size, then the
request header: api_key int16, api_version int16, correlation_id int32) to remember which
correlation ids are Produce requests, and can drop their responses: the broker has written the
records, the producer never hears so, times out and sends them again — a lost acknowledgement.
"""

import selectors
import socket
import struct
import threading

from kdg.stack.layout import HOST, StackLayout

PRODUCE = 0


class _Link:
    """One client connection and its upstream connection to the broker."""

    def __init__(self, client: socket.socket, upstream: socket.socket):
        self.client, self.upstream = client, upstream
        self.requests = bytearray()    # client bytes not yet parsed into whole frames
        self.responses = bytearray()   # broker bytes not yet forwarded as whole frames
        self.produce_ids: set[int] = set()


class FaultProxy:
    """Forward every broker's FAULTY listener through loopback ports; drop produce responses on demand."""

    def __init__(self, layout: StackLayout):
        self.layout = layout
        self.dropped = 0
        self._to_drop = 0
        self._lock = threading.Lock()
        self._sel = selectors.DefaultSelector()
        self._links: list[_Link] = []
        self._listeners: list[socket.socket] = []
        self._wake_r, self._wake_w = socket.socketpair()
        self._running = False
        self._thread: threading.Thread | None = None

    # -- control -----------------------------------------------------------------------------
    def drop_produce_responses(self, count: int) -> None:
        """Swallow the broker's responses to the next ``count`` produce requests that get one."""
        with self._lock:
            self._to_drop = count

    def pass_through(self) -> None:
        with self._lock:
            self._to_drop = 0

    def start(self) -> "FaultProxy":
        for node in self.layout.node_ids:
            listener = socket.create_server((HOST, self.layout.proxy_port(node)), reuse_port=False)
            listener.setblocking(False)
            self._sel.register(listener, selectors.EVENT_READ, ("accept", node))
            self._listeners.append(listener)
        self._sel.register(self._wake_r, selectors.EVENT_READ, ("wake", None))
        self._running = True
        self._thread = threading.Thread(target=self._loop, name="kdg-fault-proxy", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._running = False
        self._wake_w.send(b"x")
        if self._thread:
            self._thread.join(10)
        for link in self._links:
            self._close(link)
        for sock in self._listeners + [self._wake_r, self._wake_w]:
            sock.close()
        self._sel.close()

    def __enter__(self) -> "FaultProxy":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- the loop ----------------------------------------------------------------------------
    def _loop(self) -> None:
        while self._running:
            for key, _ in self._sel.select(timeout=0.5):
                kind, obj = key.data
                try:
                    if kind == "accept":
                        self._accept(key.fileobj, obj)
                    elif kind == "client":
                        self._from_client(obj)
                    elif kind == "upstream":
                        self._from_broker(obj)
                except OSError:
                    if kind in ("client", "upstream"):
                        self._close(obj)

    def _accept(self, listener: socket.socket, node: int) -> None:
        client, _ = listener.accept()
        upstream = socket.create_connection((HOST, self.layout.faulty_port(node)), timeout=5)
        for sock in (client, upstream):
            sock.setblocking(True)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        link = _Link(client, upstream)
        self._links.append(link)
        self._sel.register(client, selectors.EVENT_READ, ("client", link))
        self._sel.register(upstream, selectors.EVENT_READ, ("upstream", link))

    def _from_client(self, link: _Link) -> None:
        data = link.client.recv(1 << 16)
        if not data:
            return self._close(link)
        link.upstream.sendall(data)  # requests always reach the broker
        link.requests += data
        while len(link.requests) >= 4:
            size = struct.unpack_from(">i", link.requests)[0]
            if len(link.requests) < 4 + size:
                break
            api_key, _version, correlation = struct.unpack_from(">hhi", link.requests, 4)
            if api_key == PRODUCE:
                link.produce_ids.add(correlation)
            del link.requests[:4 + size]

    def _from_broker(self, link: _Link) -> None:
        data = link.upstream.recv(1 << 16)
        if not data:
            return self._close(link)
        link.responses += data
        out = bytearray()
        while len(link.responses) >= 8:
            size = struct.unpack_from(">i", link.responses)[0]
            if len(link.responses) < 4 + size:
                break
            correlation = struct.unpack_from(">i", link.responses, 4)[0]
            frame = link.responses[:4 + size]
            del link.responses[:4 + size]
            if correlation in link.produce_ids:
                link.produce_ids.discard(correlation)
                with self._lock:
                    if self._to_drop > 0:
                        self._to_drop -= 1
                        self.dropped += 1
                        continue  # the broker wrote the records; the producer never learns it
            out += frame
        if out:
            link.client.sendall(out)

    def _close(self, link: _Link) -> None:
        for sock in (link.client, link.upstream):
            try:
                self._sel.unregister(sock)
            except (KeyError, ValueError):
                pass
            sock.close()
        if link in self._links:
            self._links.remove(link)
