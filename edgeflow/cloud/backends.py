"""Where a server's requests run, behind the gRPC front end's checks.

The front end (server.py) authenticates, parses and checks every request against the
hosted package (models.HostedModel) and then hands the checked feeds to a backend:

- `Local`: this process, on the model's pool of interpreters, and split-training rounds
  on the model's StepHost (the embedded server, the default);
- `batching.Batching(inner, ...)`: requests of many devices for one model and cut run
  as one batch on `inner` (Clipper's adaptive batching);
- `cache.Cached(inner, ...)`: an LRU of replies keyed by the model, the fetches and a
  hash of the feeds, in front of `inner`;
- `replicas.RayBackend`: model replicas as Ray Serve deployments and training state in
  Ray actors, shared by every front end attached to the cluster.

A backend has `run(model, fetches, feeds, reservation, encoding) -> {name: array}`,
`round(model, device_id, step, feeds, fetches) -> {name: array}` (step: the request's
TrainStep) and `close()`.
"""
from ..errors import RemoteError
from .metrics import NO_METRICS


class Unavailable(RemoteError):
    """No replica could run the request now (the server answers UNAVAILABLE: try again)."""


class Local:
    """Runs requests in this process. `state_dir`, `checkpoint_every` and `max_devices`
    go to each trained model's StepHost."""

    def __init__(self, models, state_dir=None, checkpoint_every=1, max_devices=256, metrics=NO_METRICS):
        self.models = models
        self.state_dir, self.checkpoint_every, self.max_devices = state_dir, checkpoint_every, max_devices
        self.metrics = metrics

    def run(self, model, fetches, feeds, reservation, encoding=""):
        return model.run(fetches, feeds, reservation, encoding)

    def round(self, model, device_id, step, feeds, fetches):
        host = model.step_host(self.state_dir, self.checkpoint_every, max_devices=self.max_devices)
        outputs = host.round(device_id, step.step_id, step.round, feeds, fetches, list(step.keep),
                             [int(t) for t in step.targets], step.final)
        if step.final:
            self.metrics.step(model.id)
        return outputs

    def close(self):
        """Checkpoint the training state, to resume from."""
        for model in self.models.all():
            if model.steps is not None:
                model.steps.close()
