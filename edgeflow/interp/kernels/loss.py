"""Kernels of edgeflow/ops/loss.py. Sums run in float32 for float16 scores."""
import numpy as np

from . import kernel


def _wide(dtype):
    return np.dtype(np.float32) if dtype == np.float16 else dtype


def _picks(labels, weight, ignore, classes, dtype):
    """(each label's class as an index along axis 1, its weight or None where all weigh 1).

    Ignored labels pick class 0 with weight 0; IndexError (reported as InvalidInputError)
    for another label outside [0, classes).
    """
    ignored = np.isin(labels, ignore) if ignore else np.zeros(labels.shape, bool)
    safe = np.where(ignored, 0, labels)
    if safe.size and (safe.min() < 0 or safe.max() >= classes):
        raise IndexError(f"a label is outside [0, {classes}) and not ignore_index {list(ignore)}")
    w = None if weight is None else weight.astype(dtype)[safe]
    if ignored.any():
        w = np.where(ignored, 0, 1 if w is None else w).astype(dtype)
    return np.expand_dims(safe, 1), w


def _nll(scores, labels, weight, ignore, reduction, out):
    dtype = _wide(scores.dtype)
    at, w = _picks(labels, weight, ignore, scores.shape[1], dtype)
    loss = -np.take_along_axis(scores, at, axis=1)[:, 0].astype(dtype)
    if w is not None:
        loss *= w
    if reduction == "none":
        np.copyto(out, loss, casting="unsafe")
    elif reduction == "sum":
        np.copyto(out, loss.sum(), casting="unsafe")
    else:
        np.copyto(out, loss.sum() / (loss.size if w is None else w.sum()), casting="unsafe")


def _log_softmax(x, out):
    x = x.astype(_wide(x.dtype))
    shifted = x - x.max(axis=1, keepdims=True)
    np.copyto(out, shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True)), casting="unsafe")


def _loss_inputs(ins, attrs):
    return ins[0], ins[1], ins[2] if len(ins) > 2 else None, attrs["ignore_index"], attrs["reduction"]


@kernel("nll_loss")
def _nll_loss(ins, outs, attrs):
    args = _loss_inputs(ins, attrs)
    return lambda: _nll(*args, outs[0])


@kernel("softmax_cross_entropy_loss")
def _softmax_cross_entropy_loss(ins, outs, attrs):
    scores, labels, weight, ignore, reduction = _loss_inputs(ins, attrs)
    loss, log_prob = outs

    def run():
        _log_softmax(scores, log_prob)
        _nll(log_prob, labels, weight, ignore, reduction, loss)
    return run


def _nll_grad(dloss, labels, weight, ignore, reduction, out):
    dtype = _wide(out.dtype)
    at, w = _picks(labels, weight, ignore, out.shape[1], dtype)
    scale = -dloss.astype(dtype)
    if reduction == "mean":
        scale = scale / (labels.size if w is None else w.sum())
    if w is not None:
        scale = scale * w
    out[...] = 0
    np.put_along_axis(out, at, np.expand_dims(np.broadcast_to(scale, labels.shape), 1).astype(out.dtype), axis=1)


@kernel("nll_loss_grad")
def _nll_loss_grad(ins, outs, attrs):
    dloss, labels, weight = ins[0], ins[2], ins[3] if len(ins) > 3 else None
    return lambda: _nll_grad(dloss, labels, weight, attrs["ignore_index"], attrs["reduction"], outs[0])
