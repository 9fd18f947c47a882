"""The cloud side of split models: a gRPC service that runs cloud packages and trains
them with devices.

    device = edgeflow.cloud.connect("device.efl", "host:port", token=...)   # an Interpreter
    # or: Interpreter("device.efl", delegates=[CloudDelegate("host:port", token=...)])

`Server` (server.py) hosts `.efl` packages and runs the part of a graph a device sends
it; `Client` (client.py) is what the device calls, measuring its link (`LinkStats`);
wire.py turns tensors into chunked messages and back; sendrecv.py is the device's side of
a split (`CloudDelegate`, which claims its send/recv ops, and `connect`); steps.py the
server's side of split training steps; models.py the packages a server hosts; ps/ the
parameter server (`ParameterService`, `ParameterClient`, the device loops of sync, async
and FedAvg training). The protocols are edgeflow.proto and ps.proto, compiled by
generate.sh. Needs the `cloud` extra (grpcio); importing this package imports nothing of
it until one of its names is used.
"""

_EXPORTS = {"Client": "client", "LinkStats": "client", "Server": "server",
            "CloudDelegate": "sendrecv", "connect": "sendrecv", "SplitRunner": "sendrecv",
            "ParameterService": "ps.service", "ParameterClient": "ps.client"}


def __getattr__(name):
    if name in _EXPORTS:
        import importlib
        return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
