"""The cloud side of split models: a gRPC service that runs cloud packages.

`Server` (server.py) hosts `.efl` packages and runs the part of a graph a device sends
it; `Client` (client.py) is what the device calls; wire.py turns tensors into chunked
messages and back; the protocol is edgeflow.proto (package edgeflow.v1), compiled into
edgeflow_pb2*.py by generate.sh. Needs the `cloud` extra (grpcio); importing this
package imports nothing of it until `Client`, `Server` or `Link` is used.
"""

_EXPORTS = {"Client": "client", "Link": "client", "Server": "server"}


def __getattr__(name):
    if name in _EXPORTS:
        import importlib
        return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
