"""Input pipelines with tf.data's names (`ef.data.Dataset`): deterministic and resumable.

    ds = (ef.data.Dataset.from_npz("train.npz")     # members stored by np.savez: memory-mapped
          .map(augment).shuffle(60000, seed=0).batch(32).prefetch(2))
    for batch in ds:                                # {"x": (32, ...), "y": (32,)}
        ...
    it = ds.iterator(epoch=3, position=120)         # batch 120 of epoch 3 on, as an
    it.state()                                      # uninterrupted run reads them

A dataset reads its elements by index: element i of epoch e is a function of the
pipeline, its seeds, e and i alone (map functions must be deterministic), so an iterator
starts anywhere without reading what comes before, and `Iterator.state()` is all a
training checkpoint keeps. Sources read lazily: .npz members stored uncompressed and a
folder's NAME.npy files are memory-mapped, per-example .npy and image files are read when
their element is, and shuffle permutes indices, not elements; a dataset larger than
memory costs its index arrays and the batches in flight.

Elements are numpy arrays, or tuples and dicts of them (nested). Bad input raises
InvalidInputError naming what was expected.
"""
import math
import os
import queue
import struct
import threading
import zipfile

import numpy as np

from ..errors import EdgeflowError, InvalidInputError

__all__ = ["Dataset", "Iterator", "INFINITE"]

INFINITE = -1  # the cardinality of a dataset that repeats forever (tf.data.INFINITE_CARDINALITY)
IMAGE_EXTENSIONS = (".bmp", ".gif", ".jpeg", ".jpg", ".png", ".tif", ".tiff", ".webp")
_IMAGE_MODES = {1: "L", 3: "RGB", 4: "RGBA"}


class Dataset:
    """A sequence of elements read by index; build one with a `from_*` method and chain
    map, shuffle, batch, repeat and prefetch. Each `iter(ds)` reads the next epoch (0, 1,
    ...: shuffles reshuffle, as tf.data's do); `ds.iterator(epoch, position)` starts anywhere."""

    def __init__(self, cardinality, prefetched=False):
        self._n = cardinality
        self._prefetched = prefetched  # a prefetch below: read in sequence, not by index
        self._epochs = 0

    # -- sources -----------------------------------------------------------------------

    @staticmethod
    def from_tensor_slices(tensors):
        """Elements are the slices of `tensors` (an array, or a tuple or dict of arrays)
        along their first dimension; arrays (np.memmap included) are indexed, not copied."""
        columns = _tree_map(_Array, tensors)
        return _Source(columns, _length(columns, "from_tensor_slices"))

    @staticmethod
    def from_npz(path):
        """Elements are dicts of slices of an .npz file's arrays (keys as np.savez wrote them).
        Members stored uncompressed (np.savez) are memory-mapped; compressed ones
        (np.savez_compressed) are read into memory."""
        return Dataset.from_tensor_slices(_read_npz(os.fspath(path)))

    @staticmethod
    def from_npy_folder(path):
        """Elements are dicts from a folder: each NAME.npy file is the array of NAME
        (memory-mapped, sliced along its first dimension) and each NAME/ subfolder holds one
        .npy file per element (read when the element is, in file-name order). Every name
        has the same number of elements."""
        path = os.fspath(path)
        _expect_folder(path, "from_npy_folder", "a folder of NAME.npy files or NAME/ folders of .npy files")
        columns = {}
        for entry in sorted(os.listdir(path)):
            full = os.path.join(path, entry)
            if entry.endswith(".npy") and os.path.isfile(full):
                columns[entry[:-4]] = _Array(_read_npy(full, mmap_mode="r"))
            elif os.path.isdir(full):
                files = sorted(f for f in os.listdir(full) if f.endswith(".npy"))
                if files:
                    columns[entry] = _Files([os.path.join(full, f) for f in files], _read_npy)
        if not columns:
            raise InvalidInputError(f"from_npy_folder: expected NAME.npy files or NAME/ folders of .npy files "
                                    f"in {path!r}; it has none")
        return _Source(columns, _length(columns, f"from_npy_folder({path!r})"))

    @staticmethod
    def from_image_folder(path, image_size=None, channels=3):
        """Elements {"image": uint8 (height, width, channels), "label": int64} from a folder
        of class subfolders (labels 0, 1, ... in sorted name order; the dataset's
        `class_names`), or {"image"} from a folder of image files. Images are decoded with
        Pillow when their element is read, and resized to `image_size` (height, width) if given."""
        path = os.fspath(path)
        _pillow()
        _expect_folder(path, "from_image_folder", "a folder of class subfolders of images, or of images")
        if channels not in _IMAGE_MODES:
            raise InvalidInputError(f"from_image_folder: expected channels 1, 3 or 4, got {channels!r}")
        if image_size is not None:
            image_size = tuple(image_size)
            if len(image_size) != 2 or not all(isinstance(d, int) and d >= 1 for d in image_size):
                raise InvalidInputError(f"from_image_folder: expected image_size (height, width) of positive "
                                        f"integers, got {image_size!r}")
        entries = sorted(os.listdir(path))
        classes = [e for e in entries if os.path.isdir(os.path.join(path, e))]
        images = [e for e in entries if _is_image(os.path.join(path, e))]
        if classes and images:
            raise InvalidInputError(f"from_image_folder: expected class subfolders or image files in {path!r}, "
                                    f"not both (images {images[:3]} beside folders {classes[:3]})")
        mode = _IMAGE_MODES[channels]

        def read(file):
            return _read_image(file, mode, image_size)
        if classes:
            files, labels = [], []
            for label, name in enumerate(classes):
                folder = os.path.join(path, name)
                found = [os.path.join(folder, f) for f in sorted(os.listdir(folder))]
                found = [f for f in found if _is_image(f)]
                files += found
                labels += [label] * len(found)
            columns = {"image": _Files(files, read), "label": _Array(np.array(labels, np.int64))}
        else:
            files = [os.path.join(path, f) for f in images]
            columns = {"image": _Files(files, read)}
        if not files:
            raise InvalidInputError(f"from_image_folder: expected image files ({', '.join(IMAGE_EXTENSIONS)}) in "
                                    f"{path!r} or its subfolders; it has none")
        dataset = _Source(columns, len(files))
        dataset.class_names = classes
        return dataset

    # -- transformations ---------------------------------------------------------------

    def map(self, map_func):
        """Elements map_func(element); a tuple element is passed as arguments, as tf.data does."""
        if not callable(map_func):
            raise InvalidInputError(f"map: expected a function, got {type(map_func).__name__}")
        return _Map(self, map_func)

    def shuffle(self, buffer_size, seed=None, reshuffle_each_iteration=True):
        """The elements in a random order: each drawn uniformly from a buffer of the next
        `buffer_size`, a uniform permutation when the buffer holds them all. The order is a
        function of (seed, epoch) (of the seed alone with reshuffle_each_iteration=False);
        without a seed, of one drawn now. The buffer holds indices, not elements."""
        if self._n == INFINITE:
            raise InvalidInputError("shuffle: expected a finite dataset; shuffle before repeat "
                                    "(ds.shuffle(n).repeat())")
        _positive(buffer_size, "shuffle: buffer_size")
        if seed is None:
            seed = int(np.random.SeedSequence().entropy % 2**63)
        elif isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
            raise InvalidInputError(f"shuffle: expected a seed >= 0 (an integer), got {seed!r}")
        return _Shuffle(self, int(buffer_size), int(seed), bool(reshuffle_each_iteration))

    def batch(self, batch_size, drop_remainder=False):
        """Elements are `batch_size` consecutive elements stacked (the last one smaller
        unless drop_remainder)."""
        _positive(batch_size, "batch: batch_size")
        return _Batch(self, int(batch_size), bool(drop_remainder))

    def repeat(self, count=None):
        """The dataset `count` times (forever with None or -1); repetition k reads epoch
        e * count + k of the dataset, so shuffles reshuffle each time."""
        if count == -1:
            count = None
        if count is not None and (isinstance(count, bool) or not isinstance(count, (int, np.integer)) or count < 0):
            raise InvalidInputError(f"repeat: expected a count >= 0, or None (forever), got {count!r}")
        return _Repeat(self, None if count is None else int(count))

    def prefetch(self, buffer_size):
        """The same elements, read on a background thread up to `buffer_size` ahead of the
        consumer: what comes before it in the pipeline runs on that thread (back to a
        shuffle, which reads by index: prefetch last, as with tf.data)."""
        _positive(buffer_size, "prefetch: buffer_size")
        return _Prefetch(self, int(buffer_size))

    # -- reading -----------------------------------------------------------------------

    def cardinality(self):
        """The number of elements; INFINITE if it repeats forever."""
        return self._n

    def __len__(self):
        if self._n == INFINITE:
            raise TypeError("the dataset is infinite")
        return self._n

    def __iter__(self):
        epoch, self._epochs = self._epochs, self._epochs + 1
        return self.iterator(epoch)

    def iterator(self, epoch=0, position=0):
        """An Iterator over epoch `epoch` from element `position` on."""
        return Iterator(self, epoch, position)

    def __repr__(self):
        n = "infinite" if self._n == INFINITE else self._n
        return f"<{type(self).__name__.lstrip('_')} Dataset of {n} elements>"

    # What each node implements: an element by index, a batch of them, and the elements
    # in sequence from a position (which a prefetch below makes run in sequence).

    def _get(self, epoch, i):
        raise NotImplementedError

    def _rows(self, epoch, indices):
        return _stack([self._get(epoch, int(i)) for i in indices], "batch")

    def _iterate(self, epoch, position):
        i = position
        while self._n == INFINITE or i < self._n:
            yield self._get(epoch, i)
            i += 1


class Iterator:
    """Reads a dataset's epoch in order; `state()` is its position, and
    `dataset.iterator(**state)` reads on from there."""

    def __init__(self, dataset, epoch=0, position=0):
        for name, value in (("epoch", epoch), ("position", position)):
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
                raise InvalidInputError(f"iterator: expected {name} >= 0 (an integer), got {value!r}")
        if dataset._n != INFINITE and position > dataset._n:
            raise InvalidInputError(f"iterator: expected a position <= {dataset._n} (the dataset's length), "
                                    f"got {position}")
        self.epoch, self.position = int(epoch), int(position)
        self._source = dataset._iterate(self.epoch, self.position)

    def __iter__(self):
        return self

    def __next__(self):
        element = next(self._source)
        self.position += 1
        return element

    def state(self):
        """{"epoch", "position"}: where the next element is."""
        return {"epoch": self.epoch, "position": self.position}

    def close(self):
        """Stop reading (a prefetch's thread stops too)."""
        close = getattr(self._source, "close", None)
        if close is not None:
            close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


# -- nodes ------------------------------------------------------------------------------

class _Source(Dataset):
    """Columns of one length in a structure: arrays (indexed) or files (read per element)."""

    def __init__(self, columns, n):
        super().__init__(n)
        self._columns = columns

    def _get(self, epoch, i):
        return _tree_map(lambda c: c.get(i), self._columns)

    def _rows(self, epoch, indices):
        return _tree_map(lambda c: c.rows(indices), self._columns)


class _Map(Dataset):
    def __init__(self, up, fn):
        super().__init__(up._n, up._prefetched)
        self._up, self._fn = up, fn

    def _call(self, element):
        out = self._fn(*element) if isinstance(element, tuple) else self._fn(element)
        return _tree_map(np.asarray, out)

    def _get(self, epoch, i):
        return self._call(self._up._get(epoch, i))

    def _iterate(self, epoch, position):
        if not self._prefetched:
            return super()._iterate(epoch, position)
        return (self._call(x) for x in self._up._iterate(epoch, position))


class _Shuffle(Dataset):
    def __init__(self, up, buffer_size, seed, reshuffle):
        super().__init__(up._n)  # it reads by index: a prefetch before it does not read ahead
        self._up, self._buffer, self._seed, self._reshuffle = up, buffer_size, seed, reshuffle
        self._orders, self._lock = {}, threading.Lock()  # the last two epochs' orders

    def order(self, epoch):
        """The upstream indices of epoch `epoch`, in their shuffled order."""
        key = epoch if self._reshuffle else 0
        with self._lock:
            order = self._orders.get(key)
        if order is None:
            order = _shuffled(self._up._n, self._buffer, np.random.default_rng([self._seed, key]))
            with self._lock:
                if len(self._orders) >= 2:
                    self._orders.pop(next(iter(self._orders)))
                self._orders[key] = order
        return order

    def _get(self, epoch, i):
        return self._up._get(epoch, int(self.order(epoch)[i]))

    def _rows(self, epoch, indices):
        return self._up._rows(epoch, self.order(epoch)[indices])


class _Batch(Dataset):
    def __init__(self, up, batch_size, drop_remainder):
        n = up._n
        super().__init__(INFINITE if n == INFINITE else n // batch_size if drop_remainder else -(-n // batch_size),
                         up._prefetched)
        self._up, self._size, self._drop = up, batch_size, drop_remainder

    def _get(self, epoch, j):
        start = j * self._size
        stop = start + self._size if self._up._n == INFINITE else min(start + self._size, self._up._n)
        return self._up._rows(epoch, np.arange(start, stop))

    def _iterate(self, epoch, position):
        if not self._prefetched:
            yield from super()._iterate(epoch, position)
            return
        group = []
        for element in self._up._iterate(epoch, position * self._size):
            group.append(element)
            if len(group) == self._size:
                yield _stack(group, "batch")
                group = []
        if group and not self._drop:
            yield _stack(group, "batch")


class _Repeat(Dataset):
    def __init__(self, up, count):
        n = up._n
        super().__init__(INFINITE if n == INFINITE else (INFINITE if n else 0) if count is None else n * count,
                         up._prefetched)
        self._up, self._count = up, count

    def _where(self, epoch, i):
        """(upstream epoch, upstream index) of element i of `epoch`."""
        if self._up._n == INFINITE:
            return epoch, i
        k, r = divmod(i, self._up._n)
        return (k if self._count is None else epoch * self._count + k), r

    def _get(self, epoch, i):
        return self._up._get(*self._where(epoch, i))

    def _rows(self, epoch, indices):
        n = self._up._n
        if n == INFINITE:
            return self._up._rows(epoch, indices)
        if len(indices) and np.all(indices // n == indices[0] // n):  # all of one repetition: one read
            return self._up._rows(self._where(epoch, int(indices[0]))[0], indices % n)
        return super()._rows(epoch, indices)

    def _iterate(self, epoch, position):
        if not self._prefetched:
            yield from super()._iterate(epoch, position)
            return
        if self._up._n == INFINITE:
            yield from self._up._iterate(epoch, position)
            return
        if self._up._n == 0:
            return
        k, r = divmod(position, self._up._n)
        while self._count is None or k < self._count:
            yield from self._up._iterate(self._where(epoch, k * self._up._n)[0], r)
            k, r = k + 1, 0


class _Prefetch(Dataset):
    def __init__(self, up, buffer_size):
        super().__init__(up._n, prefetched=True)
        self._up, self._buffer = up, buffer_size

    def _get(self, epoch, i):
        return self._up._get(epoch, i)

    def _rows(self, epoch, indices):
        return self._up._rows(epoch, indices)

    def _iterate(self, epoch, position):
        return _Prefetcher(self._up._iterate(epoch, position), self._buffer)


class _Prefetcher:
    """The elements of `source`, read on a background thread at most `size` ahead."""

    def __init__(self, source, size):
        self._queue, self._stop, self._done = queue.Queue(size), threading.Event(), False
        threading.Thread(target=_produce, args=(source, self._queue, self._stop), daemon=True,
                         name="edgeflow-data-prefetch").start()

    def __iter__(self):
        return self

    def __next__(self):
        if self._done:
            raise StopIteration
        ok, value = self._queue.get()
        if ok:
            return value
        self._done = True
        self.close()
        if value is None:
            raise StopIteration
        raise value

    def close(self):
        self._stop.set()

    __del__ = close


def _produce(source, out, stop):
    def put(item):
        while not stop.is_set():
            try:
                out.put(item, timeout=0.05)
                return True
            except queue.Full:
                pass
        return False
    try:
        for element in source:
            if not put((True, element)):
                return
        put((False, None))
    except BaseException as e:  # raised in the consumer's thread, by __next__
        put((False, e))
    finally:
        close = getattr(source, "close", None)
        if close is not None:
            close()


# -- columns and files ------------------------------------------------------------------

class _Array:
    def __init__(self, array):
        self.array = array if isinstance(array, np.ndarray) else np.asarray(array)

    def __len__(self):
        return len(self.array)

    def get(self, i):
        return np.asarray(self.array[i])

    def rows(self, indices):
        return np.asarray(self.array[indices])


class _Files:
    """One file per element, read by `read(path)` when the element is."""

    def __init__(self, paths, read):
        self.paths, self.read = paths, read

    def __len__(self):
        return len(self.paths)

    def get(self, i):
        return self.read(self.paths[i])

    def rows(self, indices):
        return _stack([self.get(int(i)) for i in indices], "batch")


def _read_npy(path, mmap_mode=None):
    try:
        array = np.load(path, mmap_mode=mmap_mode, allow_pickle=False)
    except (OSError, ValueError, EOFError) as e:
        raise InvalidInputError(f"cannot read {path!r} as .npy ({e}); expected an array numpy.save wrote") from None
    if not isinstance(array, np.ndarray):
        array.close()
        raise InvalidInputError(f"cannot read {path!r} as .npy (it is an .npz archive); expected an array "
                                "numpy.save wrote")
    return array


def _read_npz(path):
    if not os.path.isfile(path):
        raise InvalidInputError(f"from_npz: expected an .npz file; {path!r} "
                                + ("is a folder" if os.path.isdir(path) else "does not exist"))
    arrays = {}
    try:
        with zipfile.ZipFile(path) as archive, open(path, "rb") as f:
            for info in archive.infolist():
                if not info.filename.endswith(".npy"):
                    raise ValueError(f"member {info.filename!r} is not an .npy")
                arrays[info.filename[:-4]] = _npz_member(path, f, archive, info)
    except (zipfile.BadZipFile, zipfile.LargeZipFile, ValueError, OSError, EOFError, struct.error) as e:
        raise InvalidInputError(f"from_npz: cannot read {path!r} as .npz ({e}); expected a file numpy.savez "
                                "wrote") from None
    if not arrays:
        raise InvalidInputError(f"from_npz: expected arrays in {path!r}; it holds none")
    return arrays


def _npz_member(path, f, archive, info):
    """The member's array: memory-mapped if stored uncompressed, else read."""
    if info.compress_type == zipfile.ZIP_STORED:
        f.seek(info.header_offset)
        local = f.read(30)
        if len(local) != 30 or local[:4] != b"PK\x03\x04":
            raise ValueError(f"member {info.filename!r}: no local header at offset {info.header_offset}")
        name_length, extra_length = struct.unpack("<HH", local[26:30])
        f.seek(info.header_offset + 30 + name_length + extra_length)
        version = np.lib.format.read_magic(f)
        if version in ((1, 0), (2, 0)):
            read_header = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                           else np.lib.format.read_array_header_2_0)
            shape, fortran, dtype = read_header(f)
            if dtype.hasobject:
                raise ValueError(f"member {info.filename!r} holds Python objects, not numbers")
            offset, size = f.tell(), math.prod(shape) * dtype.itemsize
            if offset + size > os.path.getsize(path) or size > info.file_size:
                raise ValueError(f"member {info.filename!r} is truncated")
            if size == 0:
                return np.zeros(shape, dtype)
            return np.memmap(path, dtype=dtype, mode="r", offset=offset, shape=shape,
                             order="F" if fortran else "C")
    with archive.open(info) as member:
        return np.lib.format.read_array(member, allow_pickle=False)


def _pillow():
    try:
        from PIL import Image
    except ImportError:
        raise EdgeflowError("reading images needs Pillow: pip install 'edgeflow[images]'") from None
    return Image


def _is_image(path):
    return os.path.isfile(path) and path.lower().endswith(IMAGE_EXTENSIONS)


def _read_image(path, mode, size):
    Image = _pillow()
    try:
        with Image.open(path) as image:
            image = image.convert(mode)
            if size is not None and image.size != (size[1], size[0]):
                image = image.resize((size[1], size[0]), Image.BILINEAR)
            array = np.asarray(image, dtype=np.uint8)
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as e:
        raise InvalidInputError(f"cannot decode {path!r} as an image ({e}); expected an image file Pillow "
                                "reads") from None
    return array[:, :, None] if array.ndim == 2 else array


# -- helpers ----------------------------------------------------------------------------

def _tree_map(fn, tree, *rest):
    """fn over the leaves of a structure of dicts and tuples (and the same places of `rest`)."""
    if isinstance(tree, dict):
        return {k: _tree_map(fn, v, *(r[k] for r in rest)) for k, v in tree.items()}
    if isinstance(tree, tuple):
        return tuple(_tree_map(fn, v, *(r[i] for r in rest)) for i, v in enumerate(tree))
    return fn(tree, *rest)


def _named_leaves(tree, prefix=""):
    if isinstance(tree, dict):
        return [leaf for k, v in tree.items() for leaf in _named_leaves(v, f"{prefix}{k}" if not prefix
                                                                       else f"{prefix}/{k}")]
    if isinstance(tree, tuple):
        return [leaf for i, v in enumerate(tree) for leaf in _named_leaves(v, f"{prefix}[{i}]")]
    return [(prefix or "tensors", tree)]


def _spec(tree):
    return _tree_map(lambda a: (a.dtype.str, a.shape), tree)


def _describe(tree):
    leaves = _named_leaves(_tree_map(lambda a: f"{a.dtype.name}{a.shape}", tree), "")
    return ", ".join(spec if name == "tensors" else f"{name}: {spec}" for name, spec in leaves)


def _stack(elements, what):
    """The elements stacked along a new first axis; they must agree in structure, dtype and shape."""
    first = _spec(elements[0])
    for k, element in enumerate(elements[1:], 1):
        if _spec(element) != first:
            raise InvalidInputError(f"{what}: expected elements of one structure, dtype and shape; element 0 is "
                                    f"{{{_describe(elements[0])}}}, element {k} is {{{_describe(element)}}} "
                                    "(resize or pad them in map, or batch(1))")
    return _tree_map(lambda *leaves: np.stack(leaves), *elements)


def _length(columns, what):
    leaves = _named_leaves(columns)
    if not leaves:
        raise InvalidInputError(f"{what}: expected at least one array")
    for name, column in leaves:
        if isinstance(column, _Array) and column.array.ndim == 0:
            raise InvalidInputError(f"{what}: expected arrays to slice along their first dimension; "
                                    f"{name!r} is a scalar")
    lengths = {name: len(column) for name, column in leaves}
    if len(set(lengths.values())) != 1:
        raise InvalidInputError(f"{what}: expected arrays of one length (their first dimension); got "
                                + ", ".join(f"{name}: {n}" for name, n in lengths.items()))
    return next(iter(lengths.values()))


def _expect_folder(path, what, expected):
    if not os.path.isdir(path):
        raise InvalidInputError(f"{what}: expected {expected}; {path!r} "
                                + ("is a file" if os.path.exists(path) else "does not exist"))


def _positive(value, what):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise InvalidInputError(f"{what}: expected an integer >= 1, got {value!r}")


def _shuffled(n, buffer_size, rng):
    """A permutation of range(n): each index drawn uniformly from a buffer of the next
    `buffer_size` (tf.data's shuffle), a uniform permutation when the buffer holds all n."""
    if buffer_size >= n:
        return rng.permutation(n)
    out = []
    buffer = list(range(buffer_size))
    for t, j in enumerate(rng.integers(0, buffer_size, size=n - buffer_size).tolist()):
        out.append(buffer[j])
        buffer[j] = buffer_size + t
    out.extend(rng.permutation(buffer).tolist())  # the input is spent: the buffer drains at random
    return np.array(out, np.int64)
