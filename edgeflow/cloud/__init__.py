"""The cloud side of split models: a gRPC service that runs cloud packages and trains
them with devices.

`Server` (server.py) hosts `.efl` packages and runs the part of a graph a device sends
it; `Client` (client.py) is what the device calls; wire.py turns tensors into chunked
messages and back; sendrecv.py is the device's side of a split (its send/recv ops);
steps.py the server's side of split training steps; ps.py the parameter server
(`ParameterService`, `ParameterClient`) and federated.py the device loops for sync,
async and FedAvg training. The protocols are edgeflow.proto and ps.proto, compiled by
generate.sh. Needs the `cloud` extra (grpcio); importing this package imports nothing of
it until one of its classes is used.
"""

_EXPORTS = {"Client": "client", "Link": "client", "Server": "server",
            "ParameterService": "ps", "ParameterClient": "ps"}


def __getattr__(name):
    if name in _EXPORTS:
        import importlib
        return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
