"""A TCP relay on loopback that a test can cut and restore: a network partition between agents
and the portal, without touching either."""

import random
import socket
import threading


def _free_port_below_ephemeral_range() -> int:
    # While the link is cut nothing else may take its port: outgoing connections and hivemind
    # peers (listening on port 0) get ports from the ephemeral range, 32768 and up on Linux.
    while True:
        port = random.randint(20000, 32000)
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
                return port
            except OSError:
                continue


class CuttableLink:
    """Relays connections from its own port to `target_port`; `cut()` drops every connection and
    refuses new ones until `restore()`."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.connections: set[socket.socket] = set()
        self.lock = threading.Lock()
        self.port = _free_port_below_ephemeral_range()
        self.listener: socket.socket | None = None
        self.restore()

    def restore(self) -> None:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(128)
        self.listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def cut(self) -> None:
        listener, self.listener = self.listener, None
        if listener is not None:
            listener.shutdown(socket.SHUT_RDWR)  # wakes the accepting thread; close() alone would not
            listener.close()
        with self.lock:
            for connection in self.connections:
                try:
                    connection.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                connection.close()
            self.connections.clear()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target_port))
            except OSError:
                client.close()
                continue
            with self.lock:
                self.connections.update({client, upstream})
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(source, sink), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for end in (source, sink):
                try:
                    end.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
