"""A 'remote' Docker daemon for the tests: the local daemon's unix socket behind a loopback
TCP port."""

from __future__ import annotations

import socket
import threading


class TcpProxy:
    """A loopback TCP listener that forwards to the daemon's unix socket (a 'remote' daemon)."""

    def __init__(self, unix_path: str = "/var/run/docker.sock") -> None:
        self.unix_path = unix_path
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.connections = 0
        self._stop = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._stop:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            self.connections += 1
            upstream = socket.socket(socket.AF_UNIX)
            upstream.connect(self.unix_path)
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        self._stop = True
        self.server.close()
