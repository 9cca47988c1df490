"""Serve a report or a published runs directory on 127.0.0.1 for a quick look (Ctrl-C stops).

examples:
  coordinator serve runs/20260122-014700/report
  coordinator serve /var/www/html/profiles --port 8080
  coordinator serve public --port 0        # any free port; the URL is printed
"""

from __future__ import annotations

import argparse
from pathlib import Path

from profiler.argtypes import bounded, existing_dir

DEFAULT_PORT = 8000


port_number = bounded(int, 0, 65535, "port (0 takes any free port)")


class ServeCommand:
    __doc__ = __doc__

    def prepare_parser(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("directory", nargs="?", type=existing_dir, default=Path("."), metavar="DIR",
                            help="directory to serve (default: the current directory)")
        parser.add_argument("--port", type=port_number, default=DEFAULT_PORT, metavar="N",
                            help=f"TCP port on 127.0.0.1 (default {DEFAULT_PORT}; 0 picks a free one)")

    def run(self, args: argparse.Namespace) -> int:
        import functools
        import signal
        from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

        from coordinator.errors import ConfigError

        handler = functools.partial(SimpleHTTPRequestHandler, directory=str(args.directory))
        try:
            server = ThreadingHTTPServer(("127.0.0.1", args.port), handler)
        except OSError as exc:
            raise ConfigError(
                f"127.0.0.1:{args.port}: cannot listen ({exc.strerror or exc}); choose another --port (0: any free)"
            ) from None

        def stop(signum: int, frame: object) -> None:
            raise KeyboardInterrupt

        previous = signal.signal(signal.SIGTERM, stop)
        port = server.server_address[1]
        print(f"serve: {args.directory.resolve()} at http://127.0.0.1:{port}/ (Ctrl-C stops)", flush=True)
        try:
            server.serve_forever()
        except KeyboardInterrupt:
            print("serve: stopped", flush=True)
        finally:
            server.server_close()
            signal.signal(signal.SIGTERM, previous)
        return 0


COMMAND = ServeCommand
