"""A CNN on scikit-learn's bundled digits, trained on the device through the packaged
`train` signature; a crash mid-training resumes to the same result."""
import numpy as np
import pytest

import edgeflow as ef
from edgeflow import training_loop

from sklearn import datasets


def digits():
    d = datasets.load_digits()
    x = (d.images / 16.0).astype(np.float32)[:, None]  # (N, 1, 8, 8), channels first
    y = d.target.astype(np.int64)
    order = np.random.default_rng(0).permutation(len(y))
    train, test = order[:1400], order[1400:]
    return {"image": x[train], "label": y[train]}, (x[test], y[test])


def build_cnn(path, seed=0):
    g = ef.Graph()
    with g.as_default():
        ef.set_random_seed(seed)
        image = ef.placeholder(ef.float32, [None, 1, 8, 8], name="image")
        label = ef.placeholder(ef.int64, [None], name="label")
        h = ef.layers.conv2d(image, 16, 3, padding="same", activation=ef.nn.relu)
        h = ef.layers.max_pool2d(h, 2, 2)
        h = ef.layers.conv2d(h, 32, 3, padding="same", activation=ef.nn.relu)
        h = ef.layers.max_pool2d(h, 2, 2)
        logits = ef.layers.dense(ef.layers.flatten(h), 10, name="logits")
        loss = ef.losses.softmax_cross_entropy(label, logits)
        step = ef.train.Adam(0.01).minimize(loss)
    ef.save(g, path, signatures={"infer": ({"image": image}, {"logits": logits}),
                                 "train": ({"image": image, "label": label}, {"loss": loss}, [step])})


def accuracy(interp, x, y):
    return float((interp.get_signature_runner("infer")(image=x)["logits"].argmax(1) == y).mean())


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = tmp_path_factory.mktemp("digits") / "cnn.efl"
    build_cnn(path)
    return path


@pytest.mark.slow
def test_cnn_reaches_97_percent(model):
    data, (x, y) = digits()
    interp = ef.Interpreter(model)
    history = training_loop.fit(interp, data, epochs=8, batch_size=32, seed=0)
    assert history[-1][1] < history[0][1]
    assert accuracy(interp, x, y) >= 0.97


def test_crash_and_resume_equals_uninterrupted(model, tmp_path):
    data, (x, y) = digits()
    data = {k: v[:320] for k, v in data.items()}  # 10 steps per epoch: quick
    whole = ef.Interpreter(model)
    training_loop.fit(whole, data, epochs=2, batch_size=32, seed=3)

    class Crash(Exception):
        pass

    def crash(epoch, step, loss):
        if step == 13:
            raise Crash()
    with pytest.raises(Crash):
        training_loop.fit(ef.Interpreter(model), data, epochs=2, batch_size=32, seed=3,
                    checkpoint_dir=tmp_path, checkpoint_every=4, on_step=crash)
    resumed = ef.Interpreter(model)
    training_loop.fit(resumed, data, epochs=2, batch_size=32, seed=3, checkpoint_dir=tmp_path, checkpoint_every=4)
    for name, value in whole.variables().items():
        np.testing.assert_array_equal(resumed.variables()[name], value, err_msg=name)
    assert accuracy(resumed, x, y) == accuracy(whole, x, y)
