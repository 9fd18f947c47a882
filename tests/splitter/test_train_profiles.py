"""Planning a training split from profiles of the `train` signature (what the split docs
ask for): the profile has the labels among its inputs, the `infer` plan does not, and
only the inputs both share are compared (bench_split_training once saw it always warn)."""
import logging

import edgeflow as ef
from edgeflow.splitter import measure_profile
from edgeflow.splitter.package import split_file

SHAPES = {"x": (4, 8), "label": (4,)}


def build(path):
    g = ef.Graph()
    with g.as_default():
        ef.set_random_seed(0)
        x = ef.placeholder(ef.float32, [None, 8], name="x")
        label = ef.placeholder(ef.int64, [None], name="label")
        h = ef.layers.dense(x, 16, activation=ef.nn.relu, name="hidden")
        logits = ef.layers.dense(h, 3, name="logits")
        loss = ef.losses.softmax_cross_entropy(label, logits)
        step = ef.train.Adam(0.01).minimize(loss)
    ef.save(g, path, signatures={"train": ({"x": x, "label": label}, {"loss": loss}, [step]),
                                 "infer": ({"x": x}, {"logits": logits})})


def train_profile(path, tmp_path):
    profile = measure_profile(path, "train", runs=1, input_shapes=SHAPES)
    assert profile.shapes == SHAPES
    profile.save(tmp_path / "profile.json")
    return str(tmp_path / "profile.json")


def plan(path, out, profile, shapes):
    return split_file(path, out, link="wifi", train=True, input_shapes=shapes, device_profile=profile,
                      server_profile=profile)


def test_train_profiles_at_the_planned_shapes_do_not_warn(tmp_path, caplog):
    build(tmp_path / "m.efl")
    profile = train_profile(tmp_path / "m.efl", tmp_path)
    with caplog.at_level(logging.WARNING, logger="edgeflow"):
        plan(tmp_path / "m.efl", tmp_path / "same", profile, SHAPES)
    assert "may not apply" not in caplog.text


def test_train_profiles_at_other_shapes_warn(tmp_path, caplog):
    build(tmp_path / "m.efl")
    profile = train_profile(tmp_path / "m.efl", tmp_path)
    with caplog.at_level(logging.WARNING, logger="edgeflow"):
        plan(tmp_path / "m.efl", tmp_path / "other", profile, {"x": (2, 8), "label": (2,)})
    assert "may not apply" in caplog.text
    assert str({"x": (2, 8)}) in caplog.text  # the plan's shapes: the inputs `infer` takes
