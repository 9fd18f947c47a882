"""What a TFLite op handler sees: the operator with its options, and the Context that
maps TFLite tensor indices to edgeflow values, each in a layout.

**Layouts.** TFLite's images are NHWC, edgeflow's convolutions and pools NCHW. Rather than
a transpose around every such op, each value carries a permutation `perm` of TFLite's
axes: the edgeflow tensor is `np.transpose(tflite_value, perm)`. A convolution asks for
its input in NCHW (perm (0, 3, 1, 2)) and gives its output in NCHW, so a chain of them
runs without transposes; elementwise ops keep their operands' layout, ops with axes
(concatenation, reductions, padding, softmax, transpose...) map the axes through the
perm, and ops that depend on the order of elements (reshape, fully connected...) ask for
TFLite's own layout, where a transpose is inserted if the value is permuted. A TRANSPOSE
only relabels. Constants are transposed while converting.

**Quantized values.** An int8/uint8/int16 activation is held as its real value, in
float32, and rounded to its quantization grid (quantize_linear then dequantize_linear,
TFLite's rounding and saturation) wherever TFLite's op writes it: the float kernels
compute what TFLite's integer kernels do, up to the rounding of their fixed-point
rescaling. A quantized constant (weights, int32 biases) stays an integer in the file and
is dequantized once when a plan is made; its quantization axis follows its transpose.
"""
import numpy as np

from edgeflow.errors import ConversionError, UnsupportedOpError

NCHW = (0, 3, 1, 2)  # of a rank-4 NHWC value
QUANTIZED = (np.dtype(np.int8), np.dtype(np.uint8), np.dtype(np.int16))
ACTIVATIONS = {0: None, 1: "relu", 2: "relu_n1_to_1", 3: "relu6", 4: "tanh", 5: "sign_bit"}


def inverse(perm):
    return tuple(int(i) for i in np.argsort(perm))


def identity(rank):
    return tuple(range(rank))


def drop_axes(perm, axes):
    """The perm left when TFLite axes `axes` are removed from a value with `perm`."""
    kept = [p for p in perm if p not in axes]
    order = sorted(kept)
    return tuple(order.index(p) for p in kept)


class Op:
    """A TFLite operator inside its subgraph, for handlers."""

    def __init__(self, index, op, subgraph):
        self.index, self.op, self.subgraph = index, op, subgraph
        self.opcode, self.options = op.opcode, op.options
        self.inputs, self.outputs = op.inputs, op.outputs
        out = subgraph.tensors[op.outputs[0]] if op.outputs else None
        self.name = out.name if out is not None and out.name else f"{op.opcode.lower()}_{index}"

    def option(self, name, default=None):
        return self.options.get(name, default)

    def has(self, i):
        return i < len(self.inputs) and self.inputs[i] >= 0

    def tensor(self, i):
        """The reader's Tensor of input i."""
        return self.subgraph.tensors[self.inputs[i]]

    def output_tensor(self, k=0):
        return self.subgraph.tensors[self.outputs[k]]

    def where(self):
        return f"{self.opcode} op {self.index} ({self.name!r})"


class Value:
    """A converted value: an edgeflow Tensor holding TFLite's value transposed by `perm`."""

    __slots__ = ("tensor", "perm")

    def __init__(self, tensor, perm):
        self.tensor, self.perm = tensor, tuple(perm)


class Context:
    """TFLite tensor index -> Value (or a constant array), for one subgraph."""

    def __init__(self, model, subgraph, depth=0):
        self.model, self.subgraph, self.depth = model, subgraph, depth
        self.values = {}
        self.placeholders = {}  # input tensor index -> its placeholder
        self.arrays = {}     # constants known while converting, in TFLite's layout (real values
        #                      for float ones; raw integers for quantized ones)
        self._constants = {}  # (index, perm) -> Tensor made from self.arrays
        self.source = {}  # index -> the tensor whose quantization its constant value has
        for i, t in enumerate(subgraph.tensors):
            if t.data is not None and not t.is_variable:
                self.arrays[i] = densify(t) if t.sparsity is not None else t.data

    # -- reading ---------------------------------------------------------------------------
    def rank(self, i):
        if i in self.arrays:
            return self.arrays[i].ndim
        return len(self.value(i).perm)

    def tensor_shape(self, i):
        """Tensor i's shape in TFLite's layout (None for a dynamic dimension)."""
        if i in self.arrays:
            return tuple(self.arrays[i].shape)
        v = self.value(i)
        return tuple(v.tensor.shape[v.perm.index(a)] for a in range(len(v.perm)))

    def common_layout(self, indices):
        """(perm, rank) for an elementwise op over tensors `indices`: the rank of the
        broadcast result, and the layout of its first non-constant operand of that rank
        (TFLite's own if none)."""
        rank = max(self.rank(i) for i in indices)
        for i in indices:
            if i not in self.arrays and self.rank(i) == rank:
                return self.value(i).perm, rank
        return identity(rank), rank

    def is_constant(self, i):
        return i in self.arrays

    def perm(self, i):
        """The layout input `i`'s value is in; constants take any, so None."""
        return None if i in self.arrays else self.value(i).perm

    def value(self, i):
        try:
            return self.values[i]
        except KeyError:
            name = self.subgraph.tensors[i].name
            raise ConversionError(f"tensor {i} ({name!r}) is read before any op writes it") from None

    def array(self, i):
        """The value of tensor i known while converting (a constant, or computed from
        constants and static shapes), in TFLite's layout; None if it depends on inputs."""
        if i in self.arrays:
            t = self.subgraph.tensors[self.source.get(i, i)]
            data = self.arrays[i]
            return _real(data, t.quantization) if t.quantization is not None and data.dtype.kind in "iu" and \
                t.dtype in QUANTIZED else data
        if i in self.values:
            v = self.values[i]
            if v.tensor.spec.value is not None:
                return np.transpose(v.tensor.spec.value, inverse(v.perm))
        return None

    def constant(self, op, k, what):
        """The value of op input k, which this converter needs while converting."""
        value = self.array(op.inputs[k]) if op.has(k) else None
        if value is None:
            raise ConversionError(f"{op.where()}: {what} (input {k}) must be a constant")
        return value

    def integers(self, op, k, what):
        """op input k, a constant of integers (slice bounds, sizes), as a flat int64 array."""
        value = np.asarray(self.constant(op, k, what))
        if value.dtype.kind not in "iu":
            raise ConversionError(f"{op.where()}: {what} (input {k}) must hold integers, got {value.dtype}")
        return value.astype(np.int64).reshape(-1)

    def get(self, i, perm=None):
        """Tensor i as an edgeflow Tensor in layout `perm` (None: TFLite's own)."""
        rank = self.rank(i)
        perm = identity(rank) if perm is None else tuple(perm)
        if len(perm) != rank:
            raise ConversionError(f"tensor {i} ({self.subgraph.tensors[i].name!r}) has rank {rank}; "
                                  f"layout {perm} needs rank {len(perm)}")
        if i in self.arrays:
            return self._constant(i, perm)
        v = self.value(i)
        if v.perm == perm:
            return v.tensor
        from edgeflow.graph.math_ops import apply
        # v.tensor axes hold TFLite axes v.perm; axis k of the result is TFLite axis perm[k]
        order = tuple(v.perm.index(p) for p in perm)
        name = f"{self.subgraph.tensors[i].name}/{'nchw' if perm == NCHW else 'to_' + ''.join(map(str, perm))}"
        t = apply("transpose", [v.tensor], {"perm": order}, name=name)
        self.values[i] = Value(t, perm)  # later readers wanting this layout reuse it
        return t

    def get_like(self, i, perm, rank):
        """Tensor i broadcast against a value of rank `rank` in layout `perm`: numpy's
        broadcasting aligns trailing axes, so a lower-rank operand gains leading 1s
        first, then follows the perm."""
        r = self.rank(i)
        if r == rank:
            return self.get(i, perm)
        if i in self.arrays:
            data = self.array(i).reshape((1,) * (rank - r) + self.arrays[i].shape)
            return self._const_tensor(i, np.transpose(data, perm), f"/bcast{''.join(map(str, perm))}")
        from edgeflow.graph.math_ops import apply
        t = apply("expand_dims", [self.get(i)], {"axes": tuple(range(rank - r))},
                  name=f"{self.subgraph.tensors[i].name}/rank{rank}")
        if perm == identity(rank):
            return t
        return apply("transpose", [t], {"perm": perm}, name=f"{self.subgraph.tensors[i].name}/bcast")

    def _constant(self, i, perm):
        key = (i, perm)
        if key not in self._constants:
            t = self.subgraph.tensors[self.source.get(i, i)]
            data = np.transpose(self.arrays[i], perm) if perm != identity(len(perm)) else self.arrays[i]
            q = t.quantization
            if q is not None and data.dtype in (np.int8, np.uint8, np.int16, np.int32):
                self._constants[key] = self._dequantized(t, data, q, perm)
            else:
                self._constants[key] = self._const_tensor(i, data, "" if perm == identity(len(perm)) else
                                                          "/" + "".join(map(str, perm)))
        return self._constants[key]

    def _const_tensor(self, i, data, suffix):
        from edgeflow.graph.graph import constant
        if data.dtype == np.float16:
            data = data.astype(np.float32)  # edgeflow computes in float32; see convert(quantize=)
        return constant(np.ascontiguousarray(data), name=f"{self.subgraph.tensors[i].name}{suffix}")

    @staticmethod
    def _dequantized(t, data, q, perm):
        """dequantize_linear of integer constant `data` (TFLite's tensor t transposed by
        `perm`), which edgeflow keeps as integers in the file and folds when planning."""
        from edgeflow.graph.graph import constant
        from edgeflow.graph.math_ops import apply
        data = np.ascontiguousarray(data)
        axis = perm.index(q.axis) if q.axis is not None else 1
        per_tensor = q.axis is None
        scale = np.float32(q.scale[0]) if per_tensor else q.scale.astype(np.float32)
        ins = [constant(data, name=t.name), constant(np.asarray(scale, np.float32), name=f"{t.name}/scale")]
        if np.any(q.zero_point != 0) and data.dtype != np.int32:
            zp = q.zero_point[0] if per_tensor else q.zero_point
            ins.append(constant(np.asarray(zp, data.dtype), name=f"{t.name}/zero_point"))
        return apply("dequantize_linear", ins, {"axis": axis if data.ndim else 1}, name=f"{t.name}/real")

    # -- writing ---------------------------------------------------------------------------
    def set(self, i, tensor, perm=None, exact=False):
        """Tensor `tensor` (in layout `perm`, default TFLite's) is the value of TFLite
        tensor i. A quantized tensor is rounded to its grid unless `exact` (the op moves
        values without changing them)."""
        if tensor is None:
            raise ConversionError(f"tensor {i}: no value")
        if isinstance(tensor, np.ndarray):
            self.arrays[i] = tensor
            return
        perm = identity(len(tensor.shape)) if perm is None else tuple(perm)
        t = self.subgraph.tensors[i]
        if t.quantization is not None and t.dtype in QUANTIZED and not exact:
            tensor = fake_quantize(tensor, t, perm)
        self.values[i] = Value(tensor, perm)

    def alias(self, i, j):
        """Constant tensor i holds constant j's value (and its quantization)."""
        self.arrays[i] = self.arrays[j]
        self.source[i] = self.source.get(j, j)

    def same_grid(self, i, j):
        """Whether tensors i and j have the same quantization (or neither has one)."""
        a, b = self.subgraph.tensors[i].quantization, self.subgraph.tensors[j].quantization
        if a is None or b is None:
            return a is None and b is None
        return (a.axis == b.axis and np.array_equal(a.scale, b.scale)
                and np.array_equal(a.zero_point, b.zero_point))


def _real(data, q):
    shape = [1] * data.ndim
    if q.axis is not None:
        shape[q.axis] = -1
    scale = q.scale.reshape(shape) if q.axis is not None else q.scale[0]
    zero = q.zero_point.reshape(shape) if q.axis is not None else q.zero_point[0]
    return ((data.astype(np.float64) - zero) * scale).astype(np.float32)


def grid(t):
    """(scale, zero point) of quantized tensor t as quantize_linear takes them: scalars
    per tensor, vectors per axis."""
    q = t.quantization
    if q.axis is None:
        return np.float32(q.scale[0]), np.asarray(q.zero_point[0], t.dtype)
    return q.scale.astype(np.float32), np.asarray(q.zero_point, t.dtype)


def fake_quantize(tensor, t, perm):
    """`tensor` (the real value of quantized TFLite tensor t, in layout perm) rounded and
    saturated to t's grid, as TFLite's kernels write it."""
    from edgeflow.graph.math_ops import apply
    q = t.quantization
    axis = 1 if q.axis is None else perm.index(q.axis)
    scale, zero = grid(t)
    attrs = {"axis": axis if len(tensor.shape) else 1}
    quantized = apply("quantize_linear", [tensor, scale, zero], {**attrs, "dtype": t.dtype}, name=f"{t.name}/q")
    return apply("dequantize_linear", [quantized, scale, zero], attrs, name=f"{t.name}/dq")


def densify(t):
    """The dense value of sparse constant t. TFLite's SparsityParameters list the
    dimensions in traversal order (`traversal_order`; those past the tensor's rank are
    block dimensions, of the dimensions `block_map` names), each dense (its size) or CSR
    (segments, indices): the values are the leaves of that traversal."""
    s, values = t.sparsity, t.data.view(t.dtype)
    order, block_map, dims = s["traversal_order"], s["block_map"], s["dims"]
    rank = len(t.shape)
    if (len(order) != len(dims) or sorted(order) != list(range(len(order)))
            or len(order) != rank + len(block_map) or any(not 0 <= b < rank for b in block_map)):
        raise ConversionError(f"tensor {t.name!r}: inconsistent sparsity parameters")
    # coords[k]: the coordinate along traversal dimension k of each leaf so far
    coords = np.zeros((0, 1), np.int64)
    position = np.zeros(1, np.int64)  # each leaf's index into the next dimension's segments
    for d in dims:
        if d[0] == "dense":
            size = int(d[1])
            coords = np.concatenate([np.repeat(coords, size, axis=1),
                                     np.tile(np.arange(size), position.size)[None]], axis=0)
            position = (position[:, None] * size + np.arange(size)).reshape(-1)
        else:
            _, segments, indices = d
            if position.size and (position.max() + 1 >= segments.size or np.any(np.diff(segments) < 0)
                                  or segments[-1] > indices.size or segments[0] < 0):
                raise ConversionError(f"tensor {t.name!r}: sparse segments out of range")
            counts = segments[position + 1] - segments[position]
            nested = np.concatenate([np.arange(a, b) for a, b in zip(segments[position], segments[position + 1])]) \
                if position.size else np.zeros(0, np.int64)
            coords = np.concatenate([np.repeat(coords, counts, axis=1), indices[nested][None]], axis=0)
            position = nested.astype(np.int64)
    if coords.shape[1] != values.size:
        raise ConversionError(f"tensor {t.name!r}: {values.size} sparse values for {coords.shape[1]} positions")
    block = {block_map[k - rank]: int(dims[order.index(k)][1]) for k in range(rank, len(order))
             if dims[order.index(k)][0] == "dense"}
    index = np.zeros((rank, values.size), np.int64)
    for k, dim in enumerate(order):
        if dim < rank:
            index[dim] += coords[k] * block.get(dim, 1)
        else:
            index[block_map[dim - rank]] += coords[k]
    if np.any(index >= np.asarray(t.shape, np.int64)[:, None]) or np.any(index < 0):
        raise ConversionError(f"tensor {t.name!r}: sparse indices outside its shape {t.shape}")
    dense = np.zeros(t.shape, t.dtype)
    dense[tuple(index)] = values
    return dense


def unsupported(op, why):
    return UnsupportedOpError(f"{op.where()}: {why}", [(op.opcode, op.op.version, op.name, why)])

