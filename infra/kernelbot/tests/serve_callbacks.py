"""Serves the callback route in its own process (for the cross-process tests), on a
SqliteInbox or, given a ``postgresql://`` URL, a PostgresInbox:
``serve_callbacks.py <sqlite file or postgres URL> <port file>``, secret in
``CALLBACK_SECRET``. Writes the port it listens on to the port file once serving."""

from __future__ import annotations

import asyncio
import os
import socket
import sys
from pathlib import Path

import uvicorn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kernelbot_dispatch import Inbox, SqliteInbox, callback_app


async def main(db: str, port_file: str) -> None:
    inbox: Inbox
    if db.startswith("postgresql://"):
        from kernelbot_dispatch.postgres import PostgresInbox

        inbox = PostgresInbox(db)
    else:
        inbox = SqliteInbox(db)
    app = callback_app(os.environ["CALLBACK_SECRET"], inbox)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    serving = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:
        if serving.done():
            return serving.result()
        await asyncio.sleep(0.01)
    _publish_port(port_file, sock.getsockname()[1])
    await serving


def _publish_port(port_file: str, port: int) -> None:
    """Writes ``port`` to ``port_file`` in one step (a rename): the test polls for the file.
    A few bytes, once: blocking the loop for them is harmless."""
    tmp = Path(port_file + ".tmp")
    tmp.write_text(str(port))
    tmp.rename(port_file)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
