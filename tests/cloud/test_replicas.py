"""RayBackend's answers when Ray fails, without a cluster: a replica's own error comes back
as itself (StaleStep with the step to resume from), a dead or lost replica is retried and
then UNAVAILABLE (backends.Unavailable)."""
import pickle

import pytest
import ray.exceptions as rx

from edgeflow.cloud.backends import Unavailable
from edgeflow.cloud.replicas import RayBackend
from edgeflow.cloud.steps import StaleStep
from edgeflow.errors import InvalidInputError


class Model:
    id = "m"


def failing(*errors):
    """A call that raises `errors` in turn, then answers "ok"; its calls counted."""
    calls = []

    def call():
        calls.append(1)
        if len(calls) <= len(errors):
            raise errors[len(calls) - 1]
        return "ok"
    return call, calls


def test_a_dead_replica_is_retried_then_unavailable():
    backend = RayBackend(retries=2)
    call, calls = failing(rx.RayActorError(), rx.GetTimeoutError())
    assert backend._call(call, Model(), 2) == "ok" and len(calls) == 3
    call, calls = failing(*[rx.RayActorError()] * 3)
    with pytest.raises(Unavailable, match="no replica answered"):
        backend._call(call, Model(), 2)
    assert len(calls) == 3


def test_a_replicas_own_error_is_raised_as_itself_and_not_retried():
    backend = RayBackend()
    stale = pickle.loads(pickle.dumps(StaleStep("step 3 is already applied", 4)))  # as Ray carries it
    for cause in (stale, InvalidInputError("feed 'x': expected float32")):
        call, calls = failing(rx.RayTaskError("round", "Traceback ...", cause))
        with pytest.raises(type(cause)) as raised:
            backend._call(call, Model(), 2)
        assert str(raised.value) == str(cause) and len(calls) == 1
    assert raised.type is InvalidInputError
    call, _ = failing(rx.RayTaskError("round", "Traceback ...", stale))
    with pytest.raises(StaleStep) as raised:
        backend._call(call, Model(), 0)
    assert raised.value.resume_from == 4
