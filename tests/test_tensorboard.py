"""TensorBoard logging of training (edgeflow/tensorboard.py, `edgeflow train --logdir`):
the event files, read back with TensorBoard's own reader, hold the values of an SGD run
computed in numpy, the losses `fit` returned and the interpreter's weights."""
import subprocess
import sys
import time

import numpy as np
import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

import edgeflow as ef
from edgeflow import training_loop
from edgeflow.errors import EdgeflowError
from edgeflow.tensorboard import TensorBoardLogger, open_writer

N, D, LR = 16, 8, 0.1
RNG = np.random.default_rng(0)
X = RNG.standard_normal((N, D)).astype(np.float32)
Y = RNG.standard_normal((N, 1)).astype(np.float32)
W0 = (RNG.standard_normal((D, 1)) / 2).astype(np.float32)


def save_regression(path):
    """y ~ x @ w + b, mean squared error, SGD at LR; `pred` logged as a histogram, its
    largest value as a scalar."""
    g = ef.Graph()
    with g.as_default():
        x = ef.placeholder(ef.float32, [None, D], name="x")
        y = ef.placeholder(ef.float32, [None, 1], name="y")
        w, b = ef.Variable(W0, name="w"), ef.Variable(np.zeros(1, np.float32), name="b")
        pred = ef.matmul(x, w) + b
        loss = ef.reduce_mean((pred - y) * (pred - y), name="loss")
        ef.summary.histogram("pred", pred)
        ef.summary.scalar("pred_max", ef.reduce_max(pred))
        step = ef.train.GradientDescent(LR).minimize(loss)
    ef.save(g, path, {"train": ({"x": x, "y": y}, {"loss": loss}, [step]), "infer": ({"x": x}, {"y": pred})})
    return path


def numpy_sgd(steps):
    """[(w, b, pred, loss, grad_w, grad_b) before each step], and the final (w, b): full
    batches, in float64."""
    x, y = X.astype(np.float64), Y.astype(np.float64)
    w, b, trace = W0.astype(np.float64), np.zeros(1), []
    for _ in range(steps):
        pred = x @ w + b
        err = pred - y
        grad_w, grad_b = 2 * x.T @ err / N, 2 * err.sum(0) / N
        trace.append((w, b, pred, float((err ** 2).mean()), grad_w, grad_b))
        w, b = w - LR * grad_w, b - LR * grad_b
    return trace, (w, b)


def events(logdir):
    acc = EventAccumulator(str(logdir), size_guidance={"scalars": 0, "histograms": 0})
    acc.Reload()
    return acc


def scalars(acc, tag):
    return {e.step: e.value for e in acc.Scalars(tag)}


def histograms(acc, tag):
    return {e.step: e.histogram_value for e in acc.Histograms(tag)}


def assert_histogram_of(h, values, rtol=1e-5):
    """TensorBoard histogram `h` summarizes `values`: count, extremes, sums and buckets."""
    values = np.asarray(values, np.float64).reshape(-1)
    assert h.num == values.size
    np.testing.assert_allclose([h.min, h.max, h.sum, h.sum_squares],
                               [values.min(), values.max(), values.sum(), (values ** 2).sum()], rtol=rtol, atol=1e-6)
    counts, _ = np.histogram(np.asarray(values, np.float32), bins=np.asarray(h.bucket_limit))
    assert sum(h.bucket) == values.size and h.bucket[0] == 0
    assert abs(counts - np.asarray(h.bucket[1:])).sum() <= 2 * rtol * values.size + 2  # edges: float rounding


def test_fit_logs_losses_learning_rate_summaries_weights_and_gradients(tmp_path):
    interp = ef.Interpreter(save_regression(tmp_path / "m.efl"))
    logdir = tmp_path / "run"
    started = time.perf_counter()
    with TensorBoardLogger(logdir, histogram_every=2, rate_every=2) as logger:
        history = training_loop.fit(interp, {"x": X, "y": Y}, epochs=6, batch_size=N, logger=logger)
    elapsed = time.perf_counter() - started
    trace, (w_end, b_end) = numpy_sgd(6)
    acc = events(logdir)

    assert scalars(acc, "loss") == pytest.approx(dict(history), rel=1e-6)  # what fit returned
    assert scalars(acc, "loss") == pytest.approx({k + 1: t[3] for k, t in enumerate(trace)}, rel=1e-4)
    assert scalars(acc, "pred_max") == pytest.approx({k + 1: t[2].max() for k, t in enumerate(trace)}, rel=1e-4)
    assert scalars(acc, "learning_rate") == {k: pytest.approx(LR) for k in range(1, 7)}
    rates = scalars(acc, "steps_per_second")
    assert set(rates) == {2, 4, 6} and all(r >= 2 / elapsed for r in rates.values())  # 2 steps in each window

    assert set(acc.Tags()["histograms"]) == {"pred", "weights/w", "weights/b", "gradients/w", "gradients/b"}
    for tag, of in (("pred", 2), ("gradients/w", 4), ("gradients/b", 5)):
        logged = histograms(acc, tag)
        assert set(logged) == {2, 4, 6}
        for step, h in logged.items():
            assert_histogram_of(h, trace[step - 1][of])  # the step's own: before its update
    for tag, index in (("weights/w", 0), ("weights/b", 1)):
        logged = histograms(acc, tag)
        assert set(logged) == {2, 4, 6}
        for step in (2, 4):
            assert_histogram_of(logged[step], trace[step][index])  # after the step: the next step's input
    final = interp.variables()
    np.testing.assert_allclose(final["w"], w_end, rtol=1e-4, atol=1e-6)
    assert_histogram_of(histograms(acc, "weights/w")[6], final["w"], rtol=1e-7)
    assert_histogram_of(histograms(acc, "weights/b")[6], final["b"], rtol=1e-7)


def test_fetching_the_gradients_trains_as_the_plain_runner():
    """The histogram steps run through Interpreter.run: the same step as the runner's."""
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        path = save_regression(f"{tmp}/m.efl")
        data = {"x": X, "y": Y}
        plain, logged = ef.Interpreter(path), ef.Interpreter(path)
        want = training_loop.fit(plain, data, epochs=3, batch_size=4)
        with TensorBoardLogger(f"{tmp}/run", histogram_every=1) as logger:
            got = training_loop.fit(logged, data, epochs=3, batch_size=4, logger=logger)
        assert got == want
        for name, value in plain.variables().items():
            np.testing.assert_array_equal(logged.variables()[name], value)
        assert set(histograms(events(f"{tmp}/run"), "gradients/w")) == set(range(1, 13))


def test_edgeflow_train_logdir(tmp_path):
    model = save_regression(tmp_path / "m.efl")
    np.savez(tmp_path / "d.npz", x=X, y=Y)
    logdir = tmp_path / "logs"
    out = subprocess.run([sys.executable, "-m", "edgeflow.cli", "train", str(model), "--data", str(tmp_path / "d.npz"),
                          "--epochs", "4", "--batch-size", str(N), "--logdir", str(logdir),
                          "--histogram-every", "2", "-o", str(tmp_path / "trained.efl")],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    trace, _ = numpy_sgd(4)
    acc = events(logdir)
    assert scalars(acc, "loss") == pytest.approx({k + 1: t[3] for k, t in enumerate(trace)}, rel=1e-4)
    assert set(histograms(acc, "gradients/w")) == {2, 4}
    assert_histogram_of(histograms(acc, "gradients/w")[4], trace[3][4])
    trained = ef.Interpreter(tmp_path / "trained.efl").variables()
    assert_histogram_of(histograms(acc, "weights/w")[4], trained["w"], rtol=1e-7)


def test_logdir_flags_are_checked(tmp_path):
    model = save_regression(tmp_path / "m.efl")
    np.savez(tmp_path / "d.npz", x=X, y=Y)
    for extra, message in ((["--histogram-every", "2"], "--histogram-every goes with --logdir"),
                           (["--logdir", str(tmp_path / "l"), "--mode", "sync", "--cloud", "127.0.0.1:1"],
                            "--logdir is for on-device and split training, not --mode sync")):
        out = subprocess.run([sys.executable, "-m", "edgeflow.cli", "train", str(model), "--data",
                              str(tmp_path / "d.npz"), *extra], capture_output=True, text=True, timeout=120)
        assert out.returncode != 0 and message in out.stderr, out.stderr


def test_without_tensorboardx_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "tensorboardX", None)  # `import tensorboardX` raises ImportError
    with pytest.raises(EdgeflowError, match=r"pip install 'edgeflow\[tensorboard\]'"):
        open_writer(tmp_path)
    with pytest.raises(EdgeflowError, match=r"pip install 'edgeflow\[tensorboard\]'"):
        TensorBoardLogger(tmp_path)


def test_logger_arguments_are_checked(tmp_path):
    for bad in (0, -1, 1.5, True):
        with pytest.raises(EdgeflowError, match="histogram_every must be an integer >= 1"):
            TensorBoardLogger(tmp_path, histogram_every=bad)
    with pytest.raises(EdgeflowError, match="give a logdir"):
        TensorBoardLogger()
