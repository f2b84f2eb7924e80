"""Tests axlearn/common/status_server.py with a real HTTP server on 127.0.0.1."""

import html
import socket
import threading
import urllib.request

import pytest

from axlearn.common import status_server


def _get(port: int) -> tuple[int, str, str]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=10) as response:
        return response.status, response.headers["Content-type"], response.read().decode("utf-8")


def test_page_lists_every_thread_stack():
    ready, release = threading.Event(), threading.Event()

    def parked_worker_function():
        ready.set()
        release.wait(30)

    worker = threading.Thread(target=parked_worker_function, name="ParkedWorker<&>")
    worker.start()
    ready.wait(10)
    server = status_server.StatusHTTPServer(0, host="127.0.0.1")
    server.start()
    try:
        assert server.port > 0
        before = {t.ident: t.name for t in threading.enumerate()}
        status, content_type, page = _get(server.port)
        after = {t.ident for t in threading.enumerate()}
        assert status == 200
        assert content_type.startswith("text/html")
        assert page.startswith("<html>") and page.endswith("</html>")
        assert "MainThread" in page
        assert "StatusHTTPServer" in page  # The serving thread itself.
        # The other thread: its name (HTML-escaped) and the function it is parked in.
        assert "ParkedWorker&lt;&amp;&gt;" in page
        assert "parked_worker_function" in page
        # Every thread alive before and after the request is on the page (others, e.g. another
        # test's background threads, may start or end meanwhile).
        stable = [name for ident, name in before.items() if ident in after]
        assert all(html.escape(name) in page for name in stable)
        assert page.count("<pre>") >= len(stable)
    finally:
        release.set()
        worker.join()
        server.stop()


def test_stop_frees_the_port_and_start_twice_raises():
    server = status_server.StatusHTTPServer(0, host="127.0.0.1")
    server.start()
    port = server.port
    with pytest.raises(RuntimeError, match="already started"):
        server.start()
    assert _get(port)[0] == 200
    server.stop()
    assert server.thread is None
    server.stop()  # A second stop is a no-op.
    with socket.socket() as s, pytest.raises(OSError):
        s.settimeout(2)
        s.connect(("127.0.0.1", port))


def test_port_in_use_raises_in_start():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        server = status_server.StatusHTTPServer(s.getsockname()[1], host="127.0.0.1")
        with pytest.raises(OSError):
            server.start()


def test_serving_thread_is_a_daemon():
    server = status_server.StatusHTTPServer(0, host="127.0.0.1")
    server.start()
    try:
        assert server.thread.daemon
    finally:
        server.stop()
