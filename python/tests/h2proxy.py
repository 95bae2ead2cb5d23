"""A TCP proxy in front of the parameter server that can lose one HTTP/2 response: armed, it
closes the connection when the server starts answering a request (its first HEADERS frame), so
the request reached the server but its answer never reaches the client."""

from __future__ import annotations

import socket
import threading
from typing import Callable

HEADERS = 0x1


def _close(*socks: socket.socket) -> None:
    # shutdown, not only close: it ends the connection even while the other direction's thread
    # is blocked reading from it.
    for s in socks:
        try:
            s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        s.close()


class DroppingProxy:
    def __init__(self, upstream_port: int, on_drop: Callable[[], None]) -> None:
        self.upstream = ("127.0.0.1", upstream_port)
        self.on_drop = on_drop
        self.armed = threading.Event()
        self.dropped = 0
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def arm(self) -> None:
        self.armed.set()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.upstream)
            threading.Thread(target=self._pump, args=(client, server), daemon=True).start()
            threading.Thread(target=self._answers, args=(server, client), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            _close(src, dst)

    def _answers(self, server: socket.socket, client: socket.socket) -> None:
        """Server to client, frame by frame (9-byte headers: length, type, flags, stream)."""
        pending = b""
        try:
            while data := server.recv(65536):
                pending += data
                while len(pending) >= 9:
                    length = int.from_bytes(pending[:3], "big")
                    if len(pending) < 9 + length:
                        break
                    frame, pending = pending[: 9 + length], pending[9 + length :]
                    if frame[3] == HEADERS and self.armed.is_set():
                        self.armed.clear()
                        self.dropped += 1
                        self.on_drop()
                        raise OSError("dropped")
                    client.sendall(frame)
        except OSError:
            pass
        finally:
            _close(server, client)

    def close(self) -> None:
        self.listener.close()
