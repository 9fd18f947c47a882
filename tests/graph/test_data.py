"""ef.data.Dataset against numpy: sources (arrays, .npz, folders of .npy and image files),
map, shuffle (a permutation, a function of seed and epoch), batch, repeat and prefetch (it
reads ahead while the consumer waits: counted, not timed); iterators resumed anywhere read
what an uninterrupted one reads, through training_loop.fit and `edgeflow train` stopped or
killed mid-epoch; bad input is an InvalidInputError naming what was expected."""
import json
import signal
import subprocess
import sys
import threading
import time
import tracemalloc

import numpy as np
import pytest

import edgeflow as ef
from edgeflow import training_loop
from edgeflow.errors import InvalidInputError
from edgeflow.graph.data import INFINITE, Dataset

GUARD_S = 60  # hang guards only: no assertion depends on how long anything takes
LR = 0.05


def _elements(iterator):
    return [_plain(x) for x in iterator]


def _plain(x):
    """An element as nested lists and dicts, to compare with ==."""
    if isinstance(x, dict):
        return {k: _plain(v) for k, v in x.items()}
    if isinstance(x, tuple):
        return tuple(_plain(v) for v in x)
    return np.asarray(x).tolist()


def _arrays(n=23, seed=0):
    rng = np.random.default_rng(seed)
    return {"x": rng.standard_normal((n, 3)), "y": rng.standard_normal((n, 2))}


# -- sources and transformations against numpy -------------------------------------------

def test_ef_data_is_the_dataset_module():
    assert ef.data.Dataset is Dataset and ef.data.INFINITE == INFINITE


def test_from_tensor_slices_of_an_array_a_tuple_and_a_dict():
    a, b = np.arange(12).reshape(4, 3), np.arange(4) * 1.5
    assert _elements(Dataset.from_tensor_slices(a)) == a.tolist()
    assert _elements(Dataset.from_tensor_slices((a, b))) == [(a[i].tolist(), b[i].tolist()) for i in range(4)]
    nested = Dataset.from_tensor_slices({"a": a, "pair": (b, -b)})
    assert _elements(nested) == [{"a": a[i].tolist(), "pair": (b[i].tolist(), -b[i].tolist())} for i in range(4)]
    assert len(nested) == nested.cardinality() == 4


def test_map_batch_and_repeat_against_numpy():
    a, b = np.arange(10), np.arange(10) * 10
    ds = Dataset.from_tensor_slices((a, b)).map(lambda x, y: {"s": x + y, "p": x * y})
    batches = _elements(ds.batch(4))
    s, p = a + b, a * b
    assert batches == [{"s": s[i:i + 4].tolist(), "p": p[i:i + 4].tolist()} for i in (0, 4, 8)]
    assert len(ds.batch(4, drop_remainder=True)) == 2 and _elements(ds.batch(4, drop_remainder=True))[-1]["s"] == \
        s[4:8].tolist()
    assert _elements(Dataset.from_tensor_slices(a).repeat(3)) == np.tile(a, 3).tolist()
    assert _elements(Dataset.from_tensor_slices(a).repeat(2).batch(7)) == \
        [np.tile(a, 2)[i:i + 7].tolist() for i in range(0, 20, 7)]
    forever = Dataset.from_tensor_slices(a).repeat()
    assert forever.cardinality() == INFINITE and forever.batch(3).cardinality() == INFINITE
    it = iter(forever)
    assert [int(next(it)) for _ in range(25)] == np.tile(a, 3)[:25].tolist()


@pytest.mark.parametrize("buffer_size", [1, 2, 7, 23, 100])
def test_shuffle_is_a_permutation_deterministic_per_seed(buffer_size):
    n = 23
    ds = lambda seed, **kw: Dataset.from_tensor_slices(np.arange(n)).shuffle(buffer_size, seed=seed, **kw)  # noqa: E731
    orders = {(seed, epoch): _elements(ds(seed).iterator(epoch)) for seed in (0, 1) for epoch in range(3)}
    for order in orders.values():
        assert sorted(order) == list(range(n))  # every element once
        # each comes from a buffer of the next buffer_size: element t is one of inputs 0 .. t + buffer_size - 1
        assert all(x < t + buffer_size for t, x in enumerate(order))
    again = {(seed, epoch): _elements(ds(seed).iterator(epoch)) for seed in (0, 1) for epoch in range(3)}
    assert again == orders  # a function of (seed, epoch): a new dataset reads the same order
    if buffer_size == 1:
        assert all(order == list(range(n)) for order in orders.values())  # nothing to choose from
    else:
        assert len({tuple(o) for o in orders.values()}) == len(orders)  # seeds and epochs differ
        fixed = ds(0, reshuffle_each_iteration=False)
        assert _elements(fixed.iterator(0)) == _elements(fixed.iterator(2)) == orders[0, 0]
    if buffer_size >= n:  # a uniform permutation: numpy's, of (seed, epoch), as training_loop's batches
        assert orders[1, 2] == np.random.default_rng([1, 2]).permutation(n).tolist()


def test_a_buffer_of_two_draws_the_first_element_evenly_from_the_first_two():
    """Brute force over 4000 seeds: with a buffer of 2 over 3 elements the first output is
    input 0 or 1, half each, as tf.data's buffer draws it."""
    firsts = [_elements(Dataset.from_tensor_slices(np.arange(3)).shuffle(2, seed=s))[0] for s in range(4000)]
    counts = np.bincount(firsts, minlength=3)
    assert counts[2] == 0 and abs(counts[0] - 2000) < 200  # 200 is over 6 standard deviations


def test_iterating_again_reads_the_next_epoch():
    ds = Dataset.from_tensor_slices(np.arange(9)).shuffle(9, seed=4).batch(4)
    first, second = _elements(ds), _elements(ds)
    assert first == _elements(ds.iterator(0)) and second == _elements(ds.iterator(1)) and first != second
    # repeat(k): repetition r of epoch e is epoch e * k + r of what it repeats
    shuffled = Dataset.from_tensor_slices(np.arange(9)).shuffle(9, seed=4)
    assert _elements(shuffled.repeat(2).iterator(1)) == _elements(shuffled.iterator(2)) + _elements(
        shuffled.iterator(3))


def _pipeline(prefetch_at):
    """map, a small shuffle buffer, repeat, batch and prefetch somewhere: deterministic."""
    ds = Dataset.from_tensor_slices({"x": np.arange(30), "y": np.arange(30) % 7})
    if prefetch_at == "source":
        ds = ds.prefetch(3)
    ds = ds.map(lambda e: {"x": e["x"] * 2, "y": e["y"]}).shuffle(8, seed=11).repeat(2).batch(4)
    return ds.prefetch(2) if prefetch_at == "end" else ds


@pytest.mark.parametrize("prefetch_at", [None, "source", "end"])
def test_an_iterator_resumed_from_its_state_reads_what_an_uninterrupted_one_reads(prefetch_at):
    whole = _elements(_pipeline(prefetch_at).iterator(epoch=1))
    assert len(whole) == 15 and sorted(sum((b["x"] for b in whole), [])) == sorted(list(range(0, 60, 2)) * 2)
    for stop in (0, 3, 7, 14, 15):
        it = _pipeline(prefetch_at).iterator(epoch=1)
        head = [_plain(next(it)) for _ in range(stop)]
        state = json.loads(json.dumps(it.state()))  # what a checkpoint keeps
        it.close()
        assert state == {"epoch": 1, "position": stop}
        assert head + _elements(_pipeline(prefetch_at).iterator(**state)) == whole
    assert _elements(_pipeline(None).iterator(epoch=1)) == whole  # prefetch changes nothing read


# -- prefetch ------------------------------------------------------------------------------

def test_prefetch_reads_ahead_while_the_consumer_waits():
    """A slow (sleeping) loader: before each next(), the consumer waits until the loader has
    produced `ahead` elements beyond what it took, on another thread; without prefetch
    nothing is read before it is asked for."""
    n, ahead = 12, 3
    produced, lock = [], threading.Condition()
    consumer = threading.get_ident()

    def slow(x):
        time.sleep(0.005)
        with lock:
            produced.append(threading.get_ident())
            lock.notify_all()
        return x
    it = Dataset.from_tensor_slices(np.arange(n)).map(slow).prefetch(ahead).iterator()
    got = []
    for k in range(n):
        with lock:
            assert lock.wait_for(lambda: len(produced) >= min(n, k + ahead), GUARD_S), "nothing read ahead"
            # read ahead while the consumer waited, never more than the buffer and the one in hand
            assert min(n, k + ahead) <= len(produced) <= k + ahead + 1
        got.append(int(next(it)))
    assert got == list(range(n)) and consumer not in produced
    produced.clear()
    plain = Dataset.from_tensor_slices(np.arange(n)).map(slow).iterator()
    for k in range(n):
        assert len(produced) == k
        assert int(next(plain)) == k
    assert set(produced) == {consumer}


def test_prefetch_passes_on_the_loaders_error_and_close_stops_its_thread():
    def fail_at_3(x):
        if x == 3:
            raise InvalidInputError("element 3 is bad")
        return x
    it = Dataset.from_tensor_slices(np.arange(6)).map(fail_at_3).prefetch(2).iterator()
    assert [int(next(it)) for _ in range(3)] == [0, 1, 2]
    with pytest.raises(InvalidInputError, match="element 3 is bad"):
        next(it)
    with pytest.raises(StopIteration):
        next(it)
    before = set(threading.enumerate())
    it = Dataset.from_tensor_slices(np.arange(1000)).prefetch(2).iterator()
    assert int(next(it)) == 0
    (thread,) = [t for t in set(threading.enumerate()) - before if t.name == "edgeflow-data-prefetch"]
    it.close()
    thread.join(GUARD_S)
    assert not thread.is_alive()


# -- files: .npz, folders of .npy and of images ---------------------------------------------

def _peak_bytes(fn):
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_npz_members_are_memory_mapped_and_compressed_ones_read(tmp_path):
    rng = np.random.default_rng(0)
    big = rng.standard_normal((4000, 1000)).astype(np.float32)  # 16 MB
    labels = rng.integers(0, 10, 4000)
    np.savez(tmp_path / "big.npz", x=big, y=labels)
    batches = []
    peak = _peak_bytes(lambda: batches.append(
        next(Dataset.from_npz(tmp_path / "big.npz").shuffle(4000, seed=0).batch(8).iterator())))
    assert peak < 2_000_000  # the batch and the index order, not the 16 MB array
    order = np.random.default_rng([0, 0]).permutation(4000)
    np.testing.assert_array_equal(batches[0]["x"], big[order[:8]])
    np.testing.assert_array_equal(batches[0]["y"], labels[order[:8]])
    np.savez_compressed(tmp_path / "small.npz", x=big[:50], y=labels[:50])
    got = _elements(Dataset.from_npz(tmp_path / "small.npz").batch(50))
    assert got == [{"x": big[:50].tolist(), "y": labels[:50].tolist()}]
    fortran = np.asfortranarray(rng.standard_normal((6, 4)))
    np.savez(tmp_path / "f.npz", a=fortran)
    assert _elements(Dataset.from_npz(tmp_path / "f.npz")) == [{"a": row.tolist()} for row in fortran]


def test_a_folder_of_npy_files_arrays_memory_mapped_and_one_file_per_example(tmp_path):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((3000, 1000)).astype(np.float32)  # 12 MB
    np.save(tmp_path / "x.npy", x)
    (tmp_path / "y").mkdir()
    ys = [rng.integers(0, 5, (2,)) for _ in range(3000)]
    for i, y in enumerate(ys[:3000]):
        np.save(tmp_path / "y" / f"{i:05d}.npy", y)
    (tmp_path / "notes").mkdir()  # a folder without .npy files is not a column
    batch = []
    peak = _peak_bytes(lambda: batch.append(next(Dataset.from_npy_folder(tmp_path).batch(16).iterator(0, 100))))
    assert peak < 2_000_000  # the file names and a batch, not the 12 MB array
    assert len(Dataset.from_npy_folder(tmp_path)) == 3000
    np.testing.assert_array_equal(batch[0]["x"], x[1600:1616])
    np.testing.assert_array_equal(batch[0]["y"], np.stack(ys[1600:1616]))


def _write_images(folder, arrays):
    from PIL import Image
    for name, array in arrays.items():
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(array).save(path)


def test_a_folder_of_images_in_class_subfolders(tmp_path):
    rng = np.random.default_rng(2)
    pixels = {f"{c}/{i}.png": rng.integers(0, 256, (5, 6, 3), dtype=np.uint8)
              for c in ("cat", "dog", "ant") for i in range(3)}
    _write_images(tmp_path / "photos", pixels)
    (tmp_path / "photos" / "dog" / "README.txt").write_text("not an image")
    ds = Dataset.from_image_folder(tmp_path / "photos")
    assert ds.class_names == ["ant", "cat", "dog"] and len(ds) == 9
    want = [(pixels[f"{c}/{i}.png"], label) for label, c in enumerate(["ant", "cat", "dog"]) for i in range(3)]
    got = _elements(ds)
    assert got == [{"image": image.tolist(), "label": label} for image, label in want]
    gray = _elements(Dataset.from_image_folder(tmp_path / "photos", channels=1).batch(9))[0]["image"]
    luma = [(np.asarray(image, np.float64) @ [299, 587, 114]) / 1000 for image, _ in want]  # ITU-R 601-2
    assert np.abs(np.array(gray)[..., 0] - np.array(luma)).max() <= 1
    resized = next(iter(Dataset.from_image_folder(tmp_path / "photos", image_size=(4, 2)).batch(9)))
    assert resized["image"].shape == (9, 4, 2, 3) and resized["image"].dtype == np.uint8
    flat = tmp_path / "flat"
    _write_images(flat, {"b.png": pixels["cat/0.png"], "a.png": pixels["dog/1.png"]})
    assert _elements(Dataset.from_image_folder(flat)) == [{"image": pixels["dog/1.png"].tolist()},
                                                          {"image": pixels["cat/0.png"].tolist()}]


# -- bad input: typed errors that say what was expected ---------------------------------------

def test_bad_input_is_an_invalid_input_error_naming_what_was_expected(tmp_path):
    missing = str(tmp_path / "nowhere")
    with pytest.raises(InvalidInputError, match="expected a folder of NAME.npy files.*nowhere.*does not exist"):
        Dataset.from_npy_folder(missing)
    with pytest.raises(InvalidInputError, match="expected an .npz file; .*does not exist"):
        Dataset.from_npz(missing + ".npz")
    with pytest.raises(InvalidInputError, match="from_image_folder: expected a folder .*does not exist"):
        Dataset.from_image_folder(missing)
    (tmp_path / "empty").mkdir()
    with pytest.raises(InvalidInputError, match="expected NAME.npy files .* it has none"):
        Dataset.from_npy_folder(tmp_path / "empty")
    with pytest.raises(InvalidInputError, match=r"expected arrays of one length .*x: 10, y: 11"):
        Dataset.from_tensor_slices({"x": np.zeros(10), "y": np.zeros(11)})
    np.save(tmp_path / "empty" / "x.npy", np.zeros((4, 2)))
    (tmp_path / "empty" / "y").mkdir()
    for i in range(3):
        np.save(tmp_path / "empty" / "y" / f"{i}.npy", np.zeros(2))
    with pytest.raises(InvalidInputError, match=r"one length .*x: 4, y: 3"):
        Dataset.from_npy_folder(tmp_path / "empty")
    with pytest.raises(InvalidInputError, match="to slice along their first dimension; 'tensors' is a scalar"):
        Dataset.from_tensor_slices(np.float32(3))


def test_corrupt_files_are_named(tmp_path):
    np.save(tmp_path / "x.npy", np.arange(100.0))
    data = (tmp_path / "x.npy").read_bytes()
    (tmp_path / "cut").mkdir()
    (tmp_path / "cut" / "x.npy").write_bytes(data[:300])  # truncated
    with pytest.raises(InvalidInputError, match=r"cannot read .*x\.npy' as \.npy.*expected an array numpy.save"):
        Dataset.from_npy_folder(tmp_path / "cut")
    (tmp_path / "zipped").mkdir()
    np.savez(tmp_path / "zipped" / "x.npy", x=np.zeros(3))  # np.savez keeps the name: an .npz in disguise
    (tmp_path / "zipped" / "x.npy.npz").rename(tmp_path / "zipped" / "x.npy")
    with pytest.raises(InvalidInputError, match=r"x\.npy' as \.npy \(it is an \.npz archive\)"):
        Dataset.from_npy_folder(tmp_path / "zipped")
    (tmp_path / "each" / "x").mkdir(parents=True)
    np.save(tmp_path / "each" / "x" / "0.npy", np.zeros(3))
    (tmp_path / "each" / "x" / "1.npy").write_bytes(b"\x93NUMPY garbage")
    ds = Dataset.from_npy_folder(tmp_path / "each")  # read when the element is
    assert _plain(ds.iterator().__next__()) == {"x": [0.0, 0.0, 0.0]}
    with pytest.raises(InvalidInputError, match=r"1\.npy' as \.npy"):
        _elements(ds)
    np.savez(tmp_path / "d.npz", x=np.arange(1000.0), y=np.arange(1000))
    npz = (tmp_path / "d.npz").read_bytes()
    for name, damaged in (("short.npz", npz[:5000]), ("junk.npz", b"not a zip at all"),
                          ("torn.npz", npz[:40] + bytes(200) + npz[240:])):
        (tmp_path / name).write_bytes(damaged)
        with pytest.raises(InvalidInputError, match=rf"cannot read .*{name}' as \.npz .*expected a file numpy.savez"):
            Dataset.from_npz(tmp_path / name)
    _write_images(tmp_path / "img", {"a/0.png": np.zeros((4, 4, 3), np.uint8)})
    (tmp_path / "img" / "a" / "1.png").write_bytes(b"\x89PNG\r\n\x1a\n broken")
    ds = Dataset.from_image_folder(tmp_path / "img")
    with pytest.raises(InvalidInputError, match=r"cannot decode .*1\.png' as an image"):
        _elements(ds)


def test_bad_pipelines_and_arguments():
    ds = Dataset.from_tensor_slices(np.arange(6))
    ragged = ds.map(lambda x: np.zeros(int(x) % 2 + 1))
    with pytest.raises(InvalidInputError, match=r"batch: expected elements of one .*float64\(1,\).*float64\(2,\)"):
        next(iter(ragged.batch(2)))
    with pytest.raises(InvalidInputError, match="shuffle before repeat"):
        ds.repeat().shuffle(4)
    for bad in (lambda: ds.batch(0), lambda: ds.prefetch(-1), lambda: ds.shuffle(2, seed=-1),
                lambda: ds.repeat(-2), lambda: ds.iterator(position=7), lambda: ds.map(3)):
        with pytest.raises(InvalidInputError, match="expected"):
            bad()
    with pytest.raises(TypeError):
        len(ds.repeat())


# -- training: fit and `edgeflow train` read datasets and resume them -------------------------

def _linear_model(path, seed=0):
    """y = x @ W + b, mean squared error, a hand-written SGD step; its initial (W, b)."""
    rng = np.random.default_rng(seed)
    w0, b0 = rng.standard_normal((3, 2)), rng.standard_normal(2)
    g = ef.Graph()
    with g.as_default():
        x = ef.placeholder(ef.float64, [None, 3], name="x")
        y = ef.placeholder(ef.float64, [None, 2], name="y")
        w, b = ef.Variable(w0, name="W"), ef.Variable(b0, name="b")
        pred = ef.add(x @ w, b, name="pred")
        loss = ef.reduce_mean((pred - y) * (pred - y), name="loss")
        dw, db = ef.gradients(loss, [w, b])
        step = ef.group(w.assign_sub(dw * LR), b.assign_sub(db * LR))
    ef.save(g, path, signatures={"infer": ({"x": x}, {"pred": pred}),
                                 "train": ({"x": x, "y": y}, {"loss": loss}, [step])})
    return w0, b0


def _numpy_training(w, b, batches):
    for xv, yv in batches:
        err = xv @ w + b - yv
        w, b = w - LR * 2 * xv.T @ err / err.size, b - LR * 2 * err.sum(0) / err.size
    return w, b


def _reference_batches(data, batch_size, seed, epochs, transform=lambda x: x):
    """The batches of Dataset.from_tensor_slices(data).shuffle(n, seed).batch(batch_size):
    a numpy permutation per (seed, epoch)."""
    n = len(data["y"])
    for epoch in range(epochs):
        order = np.random.default_rng([seed, epoch]).permutation(n)
        for start in range(0, n, batch_size):
            index = order[start:start + batch_size]
            yield transform(data["x"][index]), data["y"][index]


def test_fit_on_a_dataset_trains_on_its_batches_and_calls_the_logger(tmp_path):
    w0, b0 = _linear_model(tmp_path / "m.efl")
    data = _arrays(37)
    ds = Dataset.from_tensor_slices(data).map(lambda e: {"x": e["x"] * 2, "y": e["y"], "unused": e["y"]})
    interp = ef.Interpreter(tmp_path / "m.efl")

    class Logger:
        calls = []

        def step(self, global_step, outputs, interpreter):
            self.calls.append((global_step, sorted(outputs), float(outputs["loss"]), interpreter))
    history = training_loop.fit(interp, ds.shuffle(37, seed=3).batch(8).prefetch(2), epochs=3, logger=Logger())
    w, b = _numpy_training(w0, b0, _reference_batches(data, 8, 3, 3, lambda x: x * 2))
    np.testing.assert_allclose(interp.variables()["W"], w, rtol=1e-12)
    np.testing.assert_allclose(interp.variables()["b"], b, rtol=1e-12)
    assert [c[0] for c in Logger.calls] == [g for g, _ in history] == list(range(1, 16))
    assert all(names == ["loss"] and it is interp for _, names, _, it in Logger.calls)
    assert [c[2] for c in Logger.calls] == [loss for _, loss in history]
    with pytest.raises(InvalidInputError, match="expected a finite dataset"):
        training_loop.fit(interp, ds.batch(8).repeat())
    with pytest.raises(InvalidInputError, match=r"expected batches as dicts of the train signature's inputs"):
        training_loop.fit(interp, Dataset.from_tensor_slices((data["x"], data["y"])).batch(8))
    with pytest.raises(InvalidInputError, match=r"the data has no \['y'\]"):
        training_loop.fit(interp, Dataset.from_tensor_slices({"x": data["x"]}).batch(8))


class Crash(Exception):
    pass


def test_fit_resumed_mid_epoch_reads_the_batches_of_an_uninterrupted_run(tmp_path):
    """A small shuffle buffer, a map and prefetch; a crash at step 13 (checkpoints at 4, 5, 8,
    10 and 12: epoch 2, batch 2) and a resume give the uninterrupted run's weights."""
    _linear_model(tmp_path / "m.efl")
    data = _arrays(37)

    def dataset():
        return (Dataset.from_tensor_slices(data).shuffle(5, seed=9).map(lambda e: {"x": e["x"] + 1, "y": e["y"]})
                .batch(8).prefetch(3))
    whole = ef.Interpreter(tmp_path / "m.efl")
    seen = []
    reference = training_loop.fit(whole, dataset(), epochs=3, logger=type(
        "L", (), {"step": lambda self, g, o, i: seen.append(g)})())

    def crash_at_13(epoch, step, loss):
        if step == 13:
            raise Crash()
    with pytest.raises(Crash):
        training_loop.fit(ef.Interpreter(tmp_path / "m.efl"), dataset(), epochs=3, checkpoint_dir=tmp_path / "ck",
                          checkpoint_every=4, on_step=crash_at_13)
    state = json.loads((tmp_path / "ck" / "state.json").read_text())
    assert state["global_step"] == 12 and state["data"] == {"epoch": 2, "position": 2, "batches_per_epoch": 5}
    resumed = ef.Interpreter(tmp_path / "m.efl")
    rest = training_loop.fit(resumed, dataset(), epochs=3, checkpoint_dir=tmp_path / "ck", checkpoint_every=4)
    assert [g for g, _ in rest] == [13, 14, 15] and rest == reference[12:]
    for name, value in whole.variables().items():
        np.testing.assert_array_equal(resumed.variables()[name], value)
    with pytest.raises(InvalidInputError, match="taken with 5 batches per epoch; the data gives 10"):
        training_loop.fit(resumed, Dataset.from_tensor_slices(data).batch(4), epochs=4,
                          checkpoint_dir=tmp_path / "ck")


def test_fit_stops_at_steps_and_goes_on_from_there(tmp_path):
    w0, b0 = _linear_model(tmp_path / "m.efl")
    data = _arrays(37)
    interp = ef.Interpreter(tmp_path / "m.efl")
    first = training_loop.fit(interp, data, epochs=2, batch_size=8, seed=2, checkpoint_dir=tmp_path / "ck", steps=7)
    assert [g for g, _ in first] == list(range(1, 8))
    rest = training_loop.fit(ef.Interpreter(tmp_path / "m.efl"), data, epochs=2, batch_size=8, seed=2,
                             checkpoint_dir=tmp_path / "ck")
    assert [g for g, _ in rest] == [8, 9, 10]
    w, _ = _numpy_training(w0, b0, _reference_batches(data, 8, 2, 2))
    restored = ef.Interpreter(tmp_path / "m.efl")
    restored.restore_checkpoint(tmp_path / "ck" / "checkpoint.npz")
    np.testing.assert_allclose(restored.variables()["W"], w, rtol=1e-12)


def _train(*args, timeout=120):
    return subprocess.run([sys.executable, "-m", "edgeflow", "train", *map(str, args)],
                          capture_output=True, text=True, timeout=timeout)


def _npy_folder(folder, data):
    """x as one memory-mapped x.npy, y as one .npy per example in y/."""
    folder.mkdir()
    np.save(folder / "x.npy", data["x"])
    (folder / "y").mkdir()
    for i, row in enumerate(data["y"]):
        np.save(folder / "y" / f"{i:06d}.npy", row)


def test_cli_train_on_a_folder_of_npy_files_stopped_mid_epoch_and_resumed(tmp_path):
    w0, b0 = _linear_model(tmp_path / "m.efl")
    data = _arrays(40)
    _npy_folder(tmp_path / "data", data)
    common = [tmp_path / "m.efl", "--data", tmp_path / "data", "--epochs", 2, "--batch-size", 8, "--seed", 5,
              "--checkpoint-dir", tmp_path / "ck", "--checkpoint-every", 3]
    r = _train(*common, "--steps", 7)  # epoch 1, batch 2
    assert r.returncode == 0 and "trained 7 steps" in r.stdout, r.stderr
    assert json.loads((tmp_path / "ck" / "state.json").read_text())["data"] == \
        {"epoch": 1, "position": 2, "batches_per_epoch": 5}
    r = _train(*common, "-o", tmp_path / "t.efl")
    assert r.returncode == 0 and "trained 3 steps" in r.stdout, r.stderr
    w, b = _numpy_training(w0, b0, _reference_batches(data, 8, 5, 2))
    trained = ef.Interpreter(tmp_path / "t.efl").variables()
    np.testing.assert_allclose(trained["W"], w, rtol=1e-12)
    np.testing.assert_allclose(trained["b"], b, rtol=1e-12)
    r = _train(tmp_path / "m.efl", "--data", tmp_path / "nowhere")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "expected an .npz file, a folder of .npy files or a folder of images" in r.stderr


@pytest.mark.slow
def test_cli_train_killed_mid_epoch_resumes_as_if_never_stopped(tmp_path):
    """SIGKILL once a checkpoint past step 20 exists (of 3000 steps), resume: the
    uninterrupted run's weights, from numpy."""
    w0, b0 = _linear_model(tmp_path / "m.efl")
    data = _arrays(3000)
    np.savez(tmp_path / "d.npz", **data)
    common = [tmp_path / "m.efl", "--data", tmp_path / "d.npz", "--batch-size", 1, "--checkpoint-dir", tmp_path / "ck",
              "--checkpoint-every", 7]
    proc = subprocess.Popen([sys.executable, "-m", "edgeflow", "train", *map(str, common)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    state = tmp_path / "ck" / "state.json"
    deadline = time.monotonic() + GUARD_S
    while not (state.exists() and json.loads(state.read_text())["global_step"] >= 21):
        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read() if proc.poll() else "hung"
        time.sleep(0.005)
    proc.send_signal(signal.SIGKILL)
    assert proc.wait(GUARD_S) == -signal.SIGKILL
    at = json.loads(state.read_text())
    assert 21 <= at["global_step"] < 3000 and at["data"]["epoch"] == 0
    r = _train(*common, "-o", tmp_path / "t.efl", timeout=300)
    assert r.returncode == 0 and f"trained {3000 - at['global_step']} steps" in r.stdout, r.stderr
    w, b = _numpy_training(w0, b0, _reference_batches(data, 1, 0, 1))
    trained = ef.Interpreter(tmp_path / "t.efl").variables()
    np.testing.assert_allclose(trained["W"], w, rtol=1e-10)
    np.testing.assert_allclose(trained["b"], b, rtol=1e-10)


def _image_model(path):
    """[N, 1, 8, 8] images in [0, 1] -> 3 classes: dense, softmax cross-entropy, SGD."""
    g = ef.Graph()
    with g.as_default():
        ef.set_random_seed(0)
        image = ef.placeholder(ef.float32, [None, 1, 8, 8], name="image")
        label = ef.placeholder(ef.int64, [None], name="label")
        logits = ef.layers.dense(ef.layers.flatten(image), 3, name="logits")
        loss = ef.losses.softmax_cross_entropy(label, logits)
        step = ef.train.GradientDescent(0.5).minimize(loss)
    ef.save(g, path, signatures={"train": ({"image": image, "label": label}, {"loss": loss}, [step])})


def test_cli_train_on_a_folder_of_images_equals_training_on_their_pixels(tmp_path):
    _image_model(tmp_path / "m.efl")
    rng = np.random.default_rng(3)
    classes = ["circle", "line", "square"]
    pixels = {f"{c}/{i:02d}.png": rng.integers(0, 256, (8, 8), dtype=np.uint8) for c in classes for i in range(7)}
    _write_images(tmp_path / "images", pixels)
    r = _train(tmp_path / "m.efl", "--data", tmp_path / "images", "--epochs", 2, "--batch-size", 4, "--seed", 1,
               "-o", tmp_path / "t.efl")
    assert r.returncode == 0 and "trained 12 steps" in r.stdout, r.stderr
    names = sorted(pixels)  # class folders in order, files in order within each
    arrays = {"image": np.stack([pixels[n] for n in names])[:, None].astype(np.float32) / np.float32(255),
              "label": np.array([classes.index(n.split("/")[0]) for n in names], np.int64)}
    local = ef.Interpreter(tmp_path / "m.efl")
    training_loop.fit(local, arrays, epochs=2, batch_size=4, seed=1)
    trained = ef.Interpreter(tmp_path / "t.efl").variables()
    for name, value in local.variables().items():
        np.testing.assert_array_equal(trained[name], value, err_msg=name)
