"""A fault proxy on the client→broker path that can swallow the broker's answers to produce requests.

Each broker has a listener (FAULTY) that advertises ``layout.proxy_port(n)``; the proxy listens
there and forwards to ``layout.faulty_port(n)``, so a client that bootstraps from
``layout.proxy_bootstrap`` keeps talking through it after the first metadata response.

It reads Kafka's framing in both directions: a request is a 4-byte big-endian size, then a header
that starts ``api_key int16, api_version int16, correlation_id int32``; a response is a size,
then ``correlation_id int32``. It remembers, per connection, which correlation ids are Produce
requests (api_key 0) and can drop their responses: the broker has written the records, the
producer never hears so, times out and sends them again — a lost acknowledgement.

On a ``--secure`` stack the FAULTY listener speaks SASL_SSL, so the proxy terminates TLS on both
sides to see the frames: to the client it presents the stack's broker certificate (signed by the
stack's CA, valid for 127.0.0.1 and localhost, which the client already trusts), and to the
broker's FAULTY port it opens its own TLS connection that verifies the stack's CA. Each side is a
sans-IO ``ssl.SSLObject`` over two ``ssl.MemoryBIO`` (:class:`_Tls`), so it stays in the one
non-blocking selector loop: ciphertext read from a socket goes into that side's incoming BIO, the
plaintext comes out of ``read()`` and through the same framing as on a plaintext stack, goes into
the other side's ``write()``, and whatever either SSLObject puts in its outgoing BIO (handshake
records included) is queued for its socket. SASL (SCRAM) runs inside TLS as ordinary Kafka
requests (SaslHandshake, SaslAuthenticate), forwarded unchanged. So ``can_drop`` is True on both
kinds of stack.

Example:
    >>> with FaultProxy(layout) as proxy:           # doctest: +SKIP
    ...     proxy.drop_produce_responses(3)
    ...     produce_through(layout.proxy_bootstrap)
    ...     assert proxy.dropped == 3
"""

import selectors
import socket
import ssl
import struct
import threading
from collections.abc import Iterator

from kdg.stack.layout import HOST, StackLayout

PRODUCE = 0
READ_CHUNK = 1 << 16


class _Tls:
    """One side's TLS session, sans-IO: ciphertext in and out through memory BIOs, never a socket."""

    def __init__(self, context: ssl.SSLContext, *, server_side: bool):
        self.incoming, self.outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
        self.obj = context.wrap_bio(self.incoming, self.outgoing, server_side=server_side,
                                    server_hostname=None if server_side else HOST)
        self.ready = False              # handshake done
        self.pending = bytearray()      # plaintext to encrypt once it is

    def receive(self, data: bytes) -> bytes:
        """Feed ciphertext from the socket; return the plaintext it completes (maybe none).

        Raises ``ConnectionResetError`` when the peer closed the TLS session, ``ssl.SSLError``
        on bad TLS (both are OSErrors: the loop closes the link).
        """
        if data:
            self.incoming.write(data)
        if not self.ready:
            try:
                self.obj.do_handshake()
            except ssl.SSLWantReadError:
                return b""
            self.ready = True
            self._encrypt_pending()
        plain = bytearray()
        while True:
            try:
                chunk = self.obj.read(READ_CHUNK)
            except ssl.SSLWantReadError:
                break
            if not chunk:  # close_notify
                raise ConnectionResetError("TLS session closed by the peer")
            plain += chunk
        return bytes(plain)

    def send(self, plain: bytes) -> None:
        """Encrypt ``plain`` into the outgoing BIO (held back until the handshake is done)."""
        self.pending += plain
        self._encrypt_pending()

    def _encrypt_pending(self) -> None:
        while self.ready and self.pending:
            del self.pending[:self.obj.write(self.pending)]

    def take(self) -> bytes:
        """The ciphertext waiting for the socket (records of the handshake, data, alerts)."""
        return self.outgoing.read()


class _Link:
    """One client connection, its own upstream connection to the broker, and what is in flight."""

    def __init__(self, client: socket.socket, upstream: socket.socket,
                 tls: tuple[_Tls, _Tls] | None = None):
        self.client, self.upstream = client, upstream
        # on a secure stack: (the session with the client, the session with the broker)
        self.tls_client, self.tls_upstream = tls if tls else (None, None)
        self.requests = bytearray()    # client bytes not yet parsed into whole frames
        self.responses = bytearray()   # broker bytes not yet parsed into whole frames
        self.to_broker = bytearray()   # bytes waiting for the upstream socket to take them
        self.to_client = bytearray()   # bytes waiting for the client socket to take them
        self.produce_ids: set[int] = set()
        self.closed = False

    def outbox(self, sock: socket.socket) -> bytearray:
        return self.to_broker if sock is self.upstream else self.to_client

    def tls_of(self, sock: socket.socket) -> _Tls | None:
        return self.tls_upstream if sock is self.upstream else self.tls_client


def _frames(buffer: bytearray, header: int) -> Iterator[tuple[bytes, bytes]]:
    """Yield ``(frame, header_bytes)`` for each complete frame in ``buffer``, consuming it."""
    while len(buffer) >= 4 + header:
        size = struct.unpack_from(">i", buffer)[0]
        if len(buffer) < 4 + size:
            return
        frame = bytes(buffer[:4 + size])
        del buffer[:4 + size]
        yield frame, frame[4:4 + header]


class FaultProxy:
    """Forward every broker's FAULTY listener through loopback ports; drop produce responses on demand.

    Runs a selector loop in one background thread; new client connections are accepted at any
    time (librdkafka reconnects after a request times out). ``dropped`` counts the responses
    swallowed, ``accepted`` the client connections, so a caller can prove the fault fired.
    """

    def __init__(self, layout: StackLayout):
        self.layout = layout
        self.can_drop = True  # on a secure stack too: the proxy terminates TLS on both sides
        self._server_tls: ssl.SSLContext | None = None  # what the proxy shows clients (secure stack)
        self._client_tls: ssl.SSLContext | None = None  # how it connects to the broker (secure stack)
        self.dropped = 0
        self.accepted = 0
        self._to_drop = 0
        self._disconnect = False
        self._lock = threading.Lock()
        self._sel = selectors.DefaultSelector()
        self._links: list[_Link] = []
        self._listeners: list[socket.socket] = []
        self._wake_r, self._wake_w = socket.socketpair()
        self._running = threading.Event()
        self._thread: threading.Thread | None = None

    # -- control -----------------------------------------------------------------------------
    def drop_produce_responses(self, count: int, *, disconnect: bool = False) -> None:
        """Swallow the broker's responses to the next ``count`` produce requests that get one.

        With ``disconnect`` the client's connection is also closed right after each swallowed
        response (a reset instead of silence); by default it stays open and the client must
        time the request out itself, as it would when an acknowledgement is really lost.
        """
        with self._lock:
            self._to_drop, self._disconnect = count, disconnect

    def pass_through(self) -> None:
        """Forward everything again."""
        with self._lock:
            self._to_drop, self._disconnect = 0, False

    @property
    def running(self) -> bool:
        return self._running.is_set()

    def start(self) -> "FaultProxy":
        """Listen on every broker's proxy port and start forwarding in a background thread."""
        if self.layout.secure:
            self._server_tls, self._client_tls = _tls_contexts(self.layout)
        try:
            for node in self.layout.node_ids:
                listener = socket.create_server((HOST, self.layout.proxy_port(node)))
                listener.setblocking(False)
                self._listeners.append(listener)
                self._sel.register(listener, selectors.EVENT_READ, ("accept", node))
        except OSError:
            self._close_all()
            raise
        self._sel.register(self._wake_r, selectors.EVENT_READ, ("wake", None))
        self._running.set()
        self._thread = threading.Thread(target=self._loop, name="kdg-fault-proxy", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop the thread and close every socket; safe to call twice."""
        if self._thread is not None:
            self._running.clear()
            self._wake_w.send(b"x")
            self._thread.join(10)
            self._thread = None
        self._close_all()

    def __enter__(self) -> "FaultProxy":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- the loop ----------------------------------------------------------------------------
    def _loop(self) -> None:
        while self._running.is_set():
            for key, events in self._sel.select(timeout=0.5):
                kind, obj = key.data
                if kind == "accept":
                    self._accept(key.fileobj, obj)  # type: ignore[arg-type]
                elif kind == "wake":
                    self._wake_r.recv(64)
                elif not obj.closed:
                    try:
                        if events & selectors.EVENT_WRITE:
                            self._flush(obj, key.fileobj)
                        if events & selectors.EVENT_READ and not obj.closed:
                            self._read(obj, key.fileobj)
                    except (OSError, ValueError, struct.error):  # a reset, or bytes that are not Kafka
                        self._close(obj)

    def _accept(self, listener: socket.socket, node: int) -> None:
        try:
            client, _ = listener.accept()
        except OSError:
            return
        try:
            upstream = socket.create_connection((HOST, self.layout.faulty_port(node)), timeout=5)
        except OSError:
            client.close()  # the broker is down: the client sees its connection closed and tries again
            return
        tls = None
        if self._server_tls is not None and self._client_tls is not None:
            tls = (_Tls(self._server_tls, server_side=True), _Tls(self._client_tls, server_side=False))
        link = _Link(client, upstream, tls)
        for sock in (client, upstream):
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._sel.register(sock, selectors.EVENT_READ, ("link", link))
        self._links.append(link)
        self.accepted += 1
        if link.tls_upstream is not None:
            try:
                link.tls_upstream.receive(b"")  # the proxy's ClientHello to the broker
                self._pump(link)
            except (OSError, ValueError):
                self._close(link)

    def _read(self, link: _Link, sock: socket.socket) -> None:
        data = sock.recv(READ_CHUNK)
        if not data:
            return self._close(link)
        tls = link.tls_of(sock)
        if tls is not None:  # ciphertext in, plaintext (maybe none yet) out
            data = tls.receive(data)
            self._pump(link)  # handshake records, session tickets, data held back for the handshake
            if not data:
                return
        if sock is link.client:
            self._forward(link, link.upstream, data)  # requests always reach the broker unchanged
            link.requests += data
            for _, header in _frames(link.requests, 8):
                api_key, _version, correlation = struct.unpack(">hhi", header)
                if api_key == PRODUCE:
                    link.produce_ids.add(correlation)
            return self._flush(link, link.upstream)
        link.responses += data
        disconnect = False
        for frame, header in _frames(link.responses, 4):
            if self._swallow(link, struct.unpack(">i", header)[0]):
                disconnect = disconnect or self._disconnect
                continue  # the broker wrote the records; the producer never learns it
            self._forward(link, link.client, frame)
        self._flush(link, link.client)
        if disconnect:
            self._close(link)

    def _forward(self, link: _Link, sock: socket.socket, plain: bytes) -> None:
        """Queue ``plain`` for ``sock``: as it is, or encrypted by that side's TLS session."""
        tls = link.tls_of(sock)
        if tls is None:
            link.outbox(sock).extend(plain)
        else:
            tls.send(plain)
            link.outbox(sock).extend(tls.take())

    def _pump(self, link: _Link) -> None:
        """Move what either TLS session wrote to its outgoing BIO to its socket."""
        for sock in (link.client, link.upstream):
            tls = link.tls_of(sock)
            if tls is not None:
                link.outbox(sock).extend(tls.take())
            self._flush(link, sock)

    def _swallow(self, link: _Link, correlation: int) -> bool:
        """Whether the response with ``correlation`` is a produce response to drop (and count it)."""
        if correlation not in link.produce_ids:
            return False
        link.produce_ids.discard(correlation)
        with self._lock:
            if self._to_drop <= 0:
                return False
            self._to_drop -= 1
            self.dropped += 1
            return True

    def _flush(self, link: _Link, sock: socket.socket) -> None:
        """Send what ``sock`` can take now; watch it for writability while anything is left."""
        box = link.outbox(sock)
        if box:
            try:
                del box[:sock.send(box)]
            except BlockingIOError:
                pass
        events = selectors.EVENT_READ | (selectors.EVENT_WRITE if box else 0)
        if self._sel.get_key(sock).events != events:
            self._sel.modify(sock, events, ("link", link))

    def _close(self, link: _Link) -> None:
        if link.closed:
            return
        link.closed = True
        for sock in (link.client, link.upstream):
            try:
                self._sel.unregister(sock)
            except (KeyError, ValueError):
                pass
            sock.close()
        self._links.remove(link)

    def _close_all(self) -> None:
        for link in list(self._links):
            self._close(link)
        for sock in self._listeners + [self._wake_r, self._wake_w]:
            sock.close()
        self._listeners = []
        self._sel.close()


def _tls_contexts(layout: StackLayout) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """The proxy's TLS: as a server, the stack's broker key and certificate (``secure/broker.pem``:
    key, certificate, CA); as a client of the broker, trusting only the stack's CA, host name checked."""
    from kdg.stack.secure import ca_path

    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(layout.secure_dir / "broker.pem")
    client = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # check_hostname and CERT_REQUIRED by default
    client.load_verify_locations(cafile=ca_path(layout))
    return server, client
