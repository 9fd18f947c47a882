"""Build the small ``.tflite`` test fixtures in tests/data/tflite/.

Regenerate with ``.venv/bin/python tests/data/tflite/make_fixtures.py``. The models are written
directly with the ``tflite`` package's FlatBuffers builder functions (the generated binding of
TensorFlow's schema.fbs), no TensorFlow: ``ModelBuilder`` below lays a model out as TFLite's own
writer does (file identifier ``TFL3``, schema version 3, an empty ``buffers[0]`` sentinel,
constant data aligned to 16 bytes, ``builtin_code`` and ``deprecated_builtin_code`` both set, an
empty QuantizationParameters table on float tensors, and optionally every constant stored past
the FlatBuffer through ``Buffer.offset``/``Buffer.size`` as the converter does for models over
2 GB). Weights come from a seeded numpy RNG and the int8/uint8 models' activation ranges from a
float twin of each model run by LiteRT's reference kernels and rounded to a 1/16 grid, so a
rerun writes byte-identical files. Operator versions follow TensorFlow's op_version.cc for the
construct used (int8 CONV_2D 3, int8 FULLY_CONNECTED 4, float16 DEQUANTIZE 3...).

At the end every fixture is loaded and invoked on random inputs by LiteRT
(``ai_edge_litert.interpreter.Interpreter``), each signature of ``batch_matmul_sig`` through its
signature runner; ``custom_op.tflite`` and ``mediapipe_landmarks.tflite`` must be refused as
unresolved custom ops instead.
Needs numpy, flatbuffers, tflite and ai-edge-litert; the tests read only the files written here.
"""

from __future__ import annotations

import importlib
import pathlib
import time

import flatbuffers
import numpy as np
import tflite  # noqa: F401  (the package's modules are loaded by name below)
from flatbuffers import flexbuffers
from tflite.ActivationFunctionType import ActivationFunctionType as Act
from tflite.BuiltinOperator import BuiltinOperator
from tflite.BuiltinOptions import BuiltinOptions
from tflite.MirrorPadMode import MirrorPadMode
from tflite.Padding import Padding
from tflite.TensorType import TensorType

HERE = pathlib.Path(__file__).resolve().parent
F32, I32, I8, U8 = np.float32, np.int32, np.int8, np.uint8
SAME, VALID = Padding.SAME, Padding.VALID

_TENSOR_TYPES = {
    np.dtype(np.float32): TensorType.FLOAT32, np.dtype(np.float16): TensorType.FLOAT16,
    np.dtype(np.int32): TensorType.INT32, np.dtype(np.uint8): TensorType.UINT8,
    np.dtype(np.int64): TensorType.INT64, np.dtype(np.bool_): TensorType.BOOL,
    np.dtype(np.int16): TensorType.INT16, np.dtype(np.int8): TensorType.INT8,
}


def _schema(name):
    """The generated module ``tflite.<name>`` (the package's ``__init__`` shadows it by its class)."""
    return importlib.import_module(f"tflite.{name}")


def _camel(field):
    return "".join(part.capitalize() for part in field.split("_"))


def _vector(b, module, field, values, prepend):
    getattr(module, f"Start{field}Vector")(b, len(values))
    for v in reversed(list(values)):
        prepend(v)
    return b.EndVector()


def _align(n, a=16):
    return (n + a - 1) // a * a


class Subgraph:
    """One subgraph's tensors and operators; buffers and operator codes live in the model."""

    def __init__(self, model, name):
        self.model, self.name = model, name
        self.tensors, self.ops, self.inputs, self.outputs = [], [], [], []

    def add_tensor(self, name, shape, dtype, data=None, quant=None, shape_signature=None):
        """Append a tensor and return its index. ``data`` (an array) makes it a constant in a
        buffer of its own; ``quant`` is ``(scales, zero_points, quantized_dimension)``."""
        dtype = np.dtype(dtype)
        buffer = 0
        if data is not None:
            data = np.asarray(data, dtype)
            assert list(data.shape) == list(shape), (name, data.shape, shape)
            buffer = self.model.add_buffer(data)
        self.tensors.append(dict(name=name, shape=[int(s) for s in shape], type=_TENSOR_TYPES[dtype],
                                 buffer=buffer, quant=quant, shape_signature=shape_signature))
        return len(self.tensors) - 1

    def const(self, name, array, dtype=None, quant=None):
        array = np.asarray(array, dtype)
        return self.add_tensor(name, array.shape, array.dtype, data=array, quant=quant)

    def add_op(self, op, inputs, outputs, options=None, custom_options=None, version=1):
        """``op`` is a BuiltinOperator name or else a custom op's code;
        ``options`` is ``(OptionsClassName, {snake_case_field: value})``."""
        opcode = self.model.opcode(op, version, custom=not hasattr(BuiltinOperator, op))
        self.ops.append(dict(opcode=opcode, inputs=list(inputs), outputs=list(outputs),
                             options=options, custom_options=custom_options))
        return outputs[0] if len(outputs) == 1 else outputs


class ModelBuilder:
    """Writes a TFLite FlatBuffer: subgraphs, buffers, operator codes, signature defs, metadata."""

    def __init__(self, description="edgeflow test fixture", external_buffers=False):
        self.description, self.external_buffers = description, external_buffers
        self.buffers = [b""]  # buffers[0]: the empty sentinel TFLite's writer puts first
        self.opcodes, self.subgraphs, self.signatures, self.metadata = [], [], [], []

    def add_subgraph(self, name):
        self.subgraphs.append(Subgraph(self, name))
        return self.subgraphs[-1]

    def add_buffer(self, array):
        self.buffers.append(np.ascontiguousarray(array).astype(array.dtype.newbyteorder("<")).tobytes())
        return len(self.buffers) - 1

    def opcode(self, op, version, custom=False):
        key = (BuiltinOperator.CUSTOM, op, version) if custom else (getattr(BuiltinOperator, op), None, version)
        if key not in self.opcodes:
            self.opcodes.append(key)
        return self.opcodes.index(key)

    def add_signature(self, key, subgraph_index, inputs, outputs):
        """``inputs``/``outputs``: ``{signature name: tensor index}`` in that subgraph."""
        self.signatures.append((key, subgraph_index, dict(inputs), dict(outputs)))

    def add_metadata(self, name, data: bytes):
        self.metadata.append((name, self.add_buffer(np.frombuffer(data, np.uint8))))

    # -- serialization -------------------------------------------------------------------
    def serialize(self) -> bytes:
        if not self.external_buffers:
            return self._build(None)
        stored = [i for i, data in enumerate(self.buffers) if data]
        # First pass with placeholder offset/size (non-default, so the fields exist and the
        # layout does not move), then the real ones: the data follows the FlatBuffer, each
        # buffer 16-byte aligned, offsets counted from the start of the file.
        size = len(self._build({i: (1, 1) for i in stored}))
        layout, pos = {}, _align(size)
        for i in stored:
            layout[i] = (pos, len(self.buffers[i]))
            pos = _align(pos + len(self.buffers[i]))
        flat = self._build(layout)
        assert len(flat) == size
        out = bytearray(flat)
        for i in stored:
            out += bytes(layout[i][0] - len(out)) + self.buffers[i]
        return bytes(out)

    def _build(self, layout):
        b = flatbuffers.Builder(1024)
        m = _schema("Model")
        buffers = [self._buffer(b, i, data, layout) for i, data in enumerate(self.buffers)]
        opcodes = [self._opcode(b, *key) for key in self.opcodes]
        subgraphs = [self._subgraph(b, sg) for sg in self.subgraphs]
        signatures = [self._signature(b, *sig) for sig in self.signatures]
        metadata = []
        for name, buffer in self.metadata:
            mm = _schema("Metadata")
            name_off = b.CreateString(name)
            mm.Start(b), mm.AddName(b, name_off), mm.AddBuffer(b, buffer)
            metadata.append(mm.End(b))
        description = b.CreateString(self.description)
        vectors = {}
        for field, items in (("OperatorCodes", opcodes), ("Subgraphs", subgraphs), ("Buffers", buffers),
                             ("Metadata", metadata), ("SignatureDefs", signatures)):
            if items or field != "Metadata":
                vectors[field] = _vector(b, m, field, items, b.PrependUOffsetTRelative)
        m.Start(b)
        m.AddVersion(b, 3)
        for field, off in vectors.items():
            getattr(m, f"Add{field}")(b, off)
        m.AddDescription(b, description)
        b.Finish(m.End(b), file_identifier=b"TFL3")
        return bytes(b.Output())

    def _buffer(self, b, index, data, layout):
        mod = _schema("Buffer")
        if layout is not None and index in layout:
            mod.Start(b), mod.AddOffset(b, layout[index][0]), mod.AddSize(b, layout[index][1])
            return mod.End(b)
        data_off = None
        if data:
            b.StartVector(1, len(data), 16)  # TFLite's writer aligns constant data to 16 bytes
            b.head -= len(data)
            b.Bytes[b.head:b.head + len(data)] = data
            data_off = b.EndVector()
        mod.Start(b)
        if data_off is not None:
            mod.AddData(b, data_off)
        return mod.End(b)

    def _opcode(self, b, code, custom, version):
        mod = _schema("OperatorCode")
        custom_off = b.CreateString(custom) if custom else None
        mod.Start(b)
        mod.AddDeprecatedBuiltinCode(b, min(code, 127))
        if custom_off is not None:
            mod.AddCustomCode(b, custom_off)
        mod.AddVersion(b, version)
        mod.AddBuiltinCode(b, code)
        return mod.End(b)

    def _quant(self, b, quant):
        mod = _schema("QuantizationParameters")
        if quant is None:  # TFLite's writer gives float tensors an empty table too
            mod.Start(b)
            return mod.End(b)
        scales, zero_points, axis = quant
        scales = np.atleast_1d(np.asarray(scales, np.float32))
        zero_points = np.atleast_1d(np.asarray(zero_points, np.int64))
        s = _vector(b, mod, "Scale", scales.tolist(), b.PrependFloat32)
        z = _vector(b, mod, "ZeroPoint", zero_points.tolist(), b.PrependInt64)
        mod.Start(b), mod.AddScale(b, s), mod.AddZeroPoint(b, z)
        if axis:
            mod.AddQuantizedDimension(b, axis)
        return mod.End(b)

    def _subgraph(self, b, sg):
        t_mod, op_mod, sg_mod = _schema("Tensor"), _schema("Operator"), _schema("SubGraph")
        tensors = []
        for t in sg.tensors:
            name = b.CreateString(t["name"])
            shape = _vector(b, t_mod, "Shape", t["shape"], b.PrependInt32)
            signature = None
            if t["shape_signature"] is not None:
                signature = _vector(b, t_mod, "ShapeSignature", t["shape_signature"], b.PrependInt32)
            quant = self._quant(b, t["quant"])
            t_mod.Start(b)
            t_mod.AddShape(b, shape), t_mod.AddType(b, t["type"]), t_mod.AddBuffer(b, t["buffer"])
            t_mod.AddName(b, name), t_mod.AddQuantization(b, quant)
            if signature is not None:
                t_mod.AddShapeSignature(b, signature)
            tensors.append(t_mod.End(b))
        ops = []
        for op in sg.ops:
            ins = _vector(b, op_mod, "Inputs", op["inputs"], b.PrependInt32)
            outs = _vector(b, op_mod, "Outputs", op["outputs"], b.PrependInt32)
            options = custom = None
            if op["options"] is not None:
                options = self._options(b, *op["options"])
            if op["custom_options"] is not None:
                custom = _vector(b, op_mod, "CustomOptions", op["custom_options"], b.PrependUint8)
            op_mod.Start(b)
            op_mod.AddOpcodeIndex(b, op["opcode"])
            op_mod.AddInputs(b, ins), op_mod.AddOutputs(b, outs)
            if options is not None:
                op_mod.AddBuiltinOptionsType(b, options[1]), op_mod.AddBuiltinOptions(b, options[0])
            if custom is not None:
                op_mod.AddCustomOptions(b, custom)  # custom_options_format FLEXBUFFERS (0)
            ops.append(op_mod.End(b))
        t_vec = _vector(b, sg_mod, "Tensors", tensors, b.PrependUOffsetTRelative)
        i_vec = _vector(b, sg_mod, "Inputs", sg.inputs, b.PrependInt32)
        o_vec = _vector(b, sg_mod, "Outputs", sg.outputs, b.PrependInt32)
        op_vec = _vector(b, sg_mod, "Operators", ops, b.PrependUOffsetTRelative)
        name = b.CreateString(sg.name)
        sg_mod.Start(b)
        sg_mod.AddTensors(b, t_vec), sg_mod.AddInputs(b, i_vec), sg_mod.AddOutputs(b, o_vec)
        sg_mod.AddOperators(b, op_vec), sg_mod.AddName(b, name)
        return sg_mod.End(b)

    def _options(self, b, class_name, fields):
        mod = _schema(class_name)
        vectors = {k: _vector(b, mod, _camel(k), [int(x) for x in v], b.PrependInt32)
                   for k, v in fields.items() if isinstance(v, (list, tuple))}
        mod.Start(b)
        for k, v in fields.items():
            getattr(mod, f"Add{_camel(k)}")(b, vectors.get(k, v))
        return mod.End(b), getattr(BuiltinOptions, class_name)

    def _signature(self, b, key, subgraph_index, inputs, outputs):
        sig, tmap = _schema("SignatureDef"), _schema("TensorMap")

        def maps(pairs):
            offs = []
            for name, index in pairs.items():
                n = b.CreateString(name)
                tmap.Start(b), tmap.AddName(b, n), tmap.AddTensorIndex(b, index)
                offs.append(tmap.End(b))
            return offs

        i_vec = _vector(b, sig, "Inputs", maps(inputs), b.PrependUOffsetTRelative)
        o_vec = _vector(b, sig, "Outputs", maps(outputs), b.PrependUOffsetTRelative)
        k = b.CreateString(key)
        sig.Start(b), sig.AddInputs(b, i_vec), sig.AddOutputs(b, o_vec)
        sig.AddSignatureKey(b, k), sig.AddSubgraphIndex(b, subgraph_index)
        return sig.End(b)


# -- helpers for the fixtures ----------------------------------------------------------------
def _f(g, name, shape):
    return g.add_tensor(name, shape, F32)


def _weights(rng, *shape, scale=0.3):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def _conv_opts(padding, stride=1, act=Act.NONE, dilation=1, multiplier=None):
    fields = dict(padding=padding, stride_w=stride, stride_h=stride, fused_activation_function=act,
                  dilation_w_factor=dilation, dilation_h_factor=dilation)
    if multiplier is None:
        return ("Conv2DOptions", fields)
    return ("DepthwiseConv2DOptions", dict(fields, depth_multiplier=multiplier))


def _pool_opts(padding, stride, size, act=Act.NONE):
    return ("Pool2DOptions", dict(padding=padding, stride_w=stride, stride_h=stride,
                                  filter_width=size, filter_height=size, fused_activation_function=act))


# -- 1. float convolutions ------------------------------------------------------------------
def conv_float():
    rng = np.random.default_rng(101)
    m = ModelBuilder()
    g = m.add_subgraph("main")
    x = _f(g, "input", [1, 16, 16, 3])
    c1 = g.add_op("CONV_2D", [x, g.const("conv1/w", _weights(rng, 8, 3, 3, 3)), g.const("conv1/b", _weights(rng, 8))],
                  [_f(g, "conv1", [1, 8, 8, 8])], _conv_opts(SAME, 2, Act.RELU6))
    dw = g.add_op("DEPTHWISE_CONV_2D", [c1, g.const("dw/w", _weights(rng, 1, 3, 3, 16)), g.const("dw/b", _weights(rng, 16))],
                  [_f(g, "dw", [1, 6, 6, 16])], _conv_opts(VALID, 1, Act.RELU, multiplier=2))
    c2 = g.add_op("CONV_2D", [dw, g.const("pw/w", _weights(rng, 16, 1, 1, 16)), g.const("pw/b", _weights(rng, 16))],
                  [_f(g, "pw", [1, 6, 6, 16])], _conv_opts(VALID))
    add = g.add_op("ADD", [c2, dw], [_f(g, "skip_add", [1, 6, 6, 16])],
                   ("AddOptions", dict(fused_activation_function=Act.NONE)))
    mp = g.add_op("MAX_POOL_2D", [add], [_f(g, "maxpool", [1, 3, 3, 16])], _pool_opts(SAME, 2, 3))
    ap = g.add_op("AVERAGE_POOL_2D", [mp], [_f(g, "avgpool", [1, 2, 2, 16])], _pool_opts(VALID, 1, 2))
    flat = g.add_op("RESHAPE", [ap, g.const("flatten/shape", [1, -1], I32)], [_f(g, "flatten", [1, 64])])
    fc = g.add_op("FULLY_CONNECTED", [flat, g.const("fc/w", _weights(rng, 10, 64, scale=0.2)), g.const("fc/b", _weights(rng, 10))],
                  [_f(g, "logits", [1, 10])],
                  ("FullyConnectedOptions", dict(fused_activation_function=Act.NONE, keep_num_dims=False)))
    out = g.add_op("SOFTMAX", [fc], [_f(g, "probs", [1, 10])], ("SoftmaxOptions", dict(beta=1.0)))
    g.inputs, g.outputs = [x], [out]
    return m


def conv_dilated():
    rng = np.random.default_rng(102)
    m = ModelBuilder()
    g = m.add_subgraph("main")
    x = _f(g, "input", [1, 12, 12, 4])
    c = g.add_op("CONV_2D", [x, g.const("conv/w", _weights(rng, 8, 3, 3, 4)), g.const("conv/b", _weights(rng, 8))],
                 [_f(g, "conv", [1, 12, 12, 8])], _conv_opts(SAME, 1, dilation=2))
    dw = g.add_op("DEPTHWISE_CONV_2D", [c, g.const("dw/w", _weights(rng, 1, 3, 3, 8)), g.const("dw/b", _weights(rng, 8))],
                  [_f(g, "dw", [1, 6, 6, 8])], _conv_opts(SAME, 2, multiplier=1), version=2)
    hs = g.add_op("HARD_SWISH", [dw], [_f(g, "hard_swish", [1, 6, 6, 8])])
    sg = g.add_op("LOGISTIC", [hs], [_f(g, "sigmoid", [1, 6, 6, 8])])
    mul = g.add_op("MUL", [hs, sg], [_f(g, "gate", [1, 6, 6, 8])], ("MulOptions", dict(fused_activation_function=Act.NONE)))
    pr = g.add_op("PRELU", [mul, g.const("prelu/alpha", rng.uniform(0.05, 0.5, 8).astype(F32))], [_f(g, "prelu", [1, 6, 6, 8])])
    th = g.add_op("TANH", [pr], [_f(g, "tanh", [1, 6, 6, 8])])
    mean = g.add_op("MEAN", [th, g.const("mean/axes", [1, 2], I32)], [_f(g, "mean", [1, 1, 1, 8])],
                    ("ReducerOptions", dict(keep_dims=True)))
    lr = g.add_op("LEAKY_RELU", [pr], [_f(g, "leaky_relu", [1, 6, 6, 8])], ("LeakyReluOptions", dict(alpha=0.2)))
    # torch.flip of a conv's output (held in NCHW) along W and C, as litert-torch writes it
    flip = g.add_op("REVERSE_V2", [c, g.const("flip/axes", [2, -1], I32)], [_f(g, "flip", [1, 12, 12, 8])])
    g.inputs, g.outputs = [x], [mean, lr, flip]
    return m


# -- 2. transpose conv, resize, depth/space --------------------------------------------------
def transpose_conv():
    rng = np.random.default_rng(103)
    m = ModelBuilder()
    g = m.add_subgraph("main")
    x = _f(g, "input", [1, 4, 4, 8])
    tc = g.add_op("TRANSPOSE_CONV", [g.const("tconv/output_shape", [1, 8, 8, 8], I32),
                                     g.const("tconv/w", _weights(rng, 8, 3, 3, 8)), x, g.const("tconv/b", _weights(rng, 8))],
                  [_f(g, "tconv", [1, 8, 8, 8])],
                  ("TransposeConvOptions", dict(padding=SAME, stride_w=2, stride_h=2)), version=3)
    r1 = g.add_op("RESIZE_BILINEAR", [tc, g.const("resize_hp/size", [12, 12], I32)], [_f(g, "resize_half_pixel", [1, 12, 12, 8])],
                  ("ResizeBilinearOptions", dict(align_corners=False, half_pixel_centers=True)), version=3)
    r2 = g.add_op("RESIZE_BILINEAR", [tc, g.const("resize_ac/size", [11, 13], I32)], [_f(g, "resize_align_corners", [1, 11, 13, 8])],
                  ("ResizeBilinearOptions", dict(align_corners=True)))
    r3 = g.add_op("RESIZE_NEAREST_NEIGHBOR", [tc, g.const("resize_nn/size", [12, 20], I32)], [_f(g, "resize_nearest", [1, 12, 20, 8])],
                  ("ResizeNearestNeighborOptions", dict(align_corners=False, half_pixel_centers=False)))
    d2s = g.add_op("DEPTH_TO_SPACE", [tc], [_f(g, "depth_to_space", [1, 16, 16, 2])], ("DepthToSpaceOptions", dict(block_size=2)))
    s2d = g.add_op("SPACE_TO_DEPTH", [r3], [_f(g, "space_to_depth", [1, 6, 10, 32])], ("SpaceToDepthOptions", dict(block_size=2)))
    g.inputs, g.outputs = [x], [r1, r2, d2s, s2d]
    return m


def global_pool():
    """Pools whose window covers the whole image (as Keras writes GlobalAveragePooling2D in
    MediaPipe's selfie segmentation), nearest resizes in the other two coordinate modes, L2 pool."""
    m = ModelBuilder()
    g = m.add_subgraph("main")
    x = _f(g, "input", [1, 9, 7, 6])
    avg = g.add_op("AVERAGE_POOL_2D", [x], [_f(g, "global_avg", [1, 1, 1, 6])],
                   ("Pool2DOptions", dict(padding=VALID, stride_w=7, stride_h=9, filter_width=7, filter_height=9,
                                          fused_activation_function=Act.NONE)))
    mx = g.add_op("MAX_POOL_2D", [x], [_f(g, "global_max", [1, 1, 1, 6])], _pool_opts(SAME, 16, 16, Act.RELU))
    l2 = g.add_op("L2_POOL_2D", [x], [_f(g, "l2_pool", [1, 4, 3, 6])], _pool_opts(VALID, 2, 2))
    r1 = g.add_op("RESIZE_NEAREST_NEIGHBOR", [x, g.const("nn_hp/size", [13, 11], I32)], [_f(g, "nearest_half_pixel", [1, 13, 11, 6])],
                  ("ResizeNearestNeighborOptions", dict(align_corners=False, half_pixel_centers=True)), version=3)
    r2 = g.add_op("RESIZE_NEAREST_NEIGHBOR", [x, g.const("nn_ac/size", [5, 12], I32)], [_f(g, "nearest_align_corners", [1, 5, 12, 6])],
                  ("ResizeNearestNeighborOptions", dict(align_corners=True, half_pixel_centers=False)), version=3)
    g.inputs, g.outputs = [x], [avg, mx, l2, r1, r2]
    return m


# -- 3. slicing and shape ops ----------------------------------------------------------------
def slicing():
    rng = np.random.default_rng(104)
    m = ModelBuilder()
    g = m.add_subgraph("main")
    x, y = _f(g, "x", [2, 6, 8, 4]), _f(g, "y", [2, 6, 8, 3])
    outs = []

    def ss(name, src, begin, end, strides, shape, **masks):
        n = len(begin)
        ins = [src, g.const(f"{name}/begin", begin, I32), g.const(f"{name}/end", end, I32),
               g.const(f"{name}/strides", strides, I32)]
        assert n == len(end) == len(strides)
        return g.add_op("STRIDED_SLICE", ins, [_f(g, name, shape)], ("StridedSliceOptions", masks),
                        version=5 if masks.get("ellipsis_mask") or masks.get("new_axis_mask") else 4)

    # x[:, -1:0:-2, 1:8:2, :]
    outs.append(ss("ss_neg_stride", x, [0, -1, 1, 0], [0, 0, 8, 0], [1, -2, 2, 1], [2, 3, 4, 4],
                   begin_mask=0b1001, end_mask=0b1001))
    ss_shrink = ss("ss_shrink", x, [1, 2, 0, 0], [2, 3, 8, 4], [1, 1, 1, 1], [8, 4], shrink_axis_mask=0b0011)
    outs.append(ss("ss_ellipsis", x, [0, 1], [0, 3], [1, 1], [2, 6, 8, 2], ellipsis_mask=0b01))
    # x[:, None, 2:5] (new_axis_mask bit 1; dims 2.. run out of spec and are taken whole)
    outs.append(ss("ss_new_axis", x, [0, 0, 2], [0, 0, 5], [1, 1, 1], [2, 1, 3, 8, 4],
                   begin_mask=0b001, end_mask=0b001, new_axis_mask=0b010))
    outs.append(g.add_op("SLICE", [x, g.const("slice/begin", [0, 1, 2, 0], I32), g.const("slice/size", [2, 3, -1, 2], I32)],
                         [_f(g, "slice", [2, 3, 6, 2])]))
    gather = g.add_op("GATHER", [x, g.const("gather/indices", [4, 0, 2], I32)], [_f(g, "gather", [2, 3, 8, 4])],
                      ("GatherOptions", dict(axis=1)))
    outs.append(g.add_op("GATHER_ND", [x, g.const("gather_nd/indices", [[0, 1], [1, 5], [1, 0]], I32)],
                         [_f(g, "gather_nd", [3, 8, 4])]))
    # rows of y (the table) at ids, as litert-torch writes torch.nn.Embedding
    outs.append(g.add_op("EMBEDDING_LOOKUP", [g.const("lookup/ids", [1, 0, 1], I32), y], [_f(g, "embedding_lookup", [3, 6, 8, 3])]))
    outs.append(g.add_op("CONCATENATION", [x, y], [_f(g, "concat_last", [2, 6, 8, 7])], ("ConcatenationOptions", dict(axis=-1))))
    outs.append(g.add_op("CONCATENATION", [x, gather], [_f(g, "concat_axis1", [2, 9, 8, 4])], ("ConcatenationOptions", dict(axis=1))))
    outs.append(g.add_op("PAD", [x, g.const("pad/paddings", [[0, 0], [1, 2], [0, 1], [0, 0]], I32)], [_f(g, "pad", [2, 9, 9, 4])]))
    outs.append(g.add_op("PADV2", [y, g.const("padv2/paddings", [[0, 0], [0, 0], [2, 1], [1, 1]], I32), g.const("padv2/value", [0.5], F32)],
                         [_f(g, "padv2", [2, 6, 11, 5])]))
    outs.append(g.add_op("MIRROR_PAD", [x, g.const("reflect/paddings", [[0, 0], [2, 1], [1, 2], [0, 0]], I32)],
                         [_f(g, "mirror_reflect", [2, 9, 11, 4])], ("MirrorPadOptions", dict(mode=MirrorPadMode.REFLECT))))
    outs.append(g.add_op("MIRROR_PAD", [y, g.const("symmetric/paddings", [[0, 0], [1, 1], [3, 0], [0, 0]], I32)],
                         [_f(g, "mirror_symmetric", [2, 8, 11, 3])], ("MirrorPadOptions", dict(mode=MirrorPadMode.SYMMETRIC))))
    halves = g.add_op("SPLIT", [g.const("split/axis", np.int32(3)), x], [_f(g, "split_0", [2, 6, 8, 2]), _f(g, "split_1", [2, 6, 8, 2])],
                      ("SplitOptions", dict(num_splits=2)))
    outs += g.add_op("SPLIT_V", [x, g.const("split_v/sizes", [3, -1, 1], I32), g.const("split_v/axis", np.int32(2))],
                     [_f(g, "split_v_0", [2, 6, 3, 4]), _f(g, "split_v_1", [2, 6, 4, 4]), _f(g, "split_v_2", [2, 6, 1, 4])],
                     ("SplitVOptions", dict(num_splits=3)))
    outs.append(g.add_op("PACK", halves, [_f(g, "pack", [2, 2, 6, 8, 2])], ("PackOptions", dict(values_count=2, axis=1))))
    u = g.add_op("UNPACK", [ss_shrink], [_f(g, f"unpack_{i}", [8]) for i in range(4)], ("UnpackOptions", dict(num=4, axis=1)))
    outs.append(g.add_op("PACK", [u[3], u[1], u[0], u[2]], [_f(g, "repack", [4, 8])], ("PackOptions", dict(values_count=4, axis=0))))
    outs.append(g.add_op("TRANSPOSE", [x, g.const("transpose/perm", [0, 3, 1, 2], I32)], [_f(g, "transpose", [2, 4, 6, 8])]))
    s = g.add_op("SUM", [x, g.const("sum/axes", [2], I32)], [_f(g, "sum", [2, 6, 1, 4])], ("ReducerOptions", dict(keep_dims=True)))
    sq = g.add_op("SQUEEZE", [s], [_f(g, "squeeze", [2, 6, 4])], ("SqueezeOptions", dict(squeeze_dims=[2])))
    outs.append(g.add_op("EXPAND_DIMS", [sq, g.const("expand/axis", np.int32(-1))], [_f(g, "expand_dims", [2, 6, 4, 1])]))
    outs.append(g.add_op("REDUCE_MAX", [x, g.const("max/axes", [1, 3], I32)], [_f(g, "reduce_max", [2, 8])],
                         ("ReducerOptions", dict(keep_dims=False))))
    outs.append(g.add_op("TILE", [y, g.const("tile/multiples", [1, 2, 1, 2], I32)], [_f(g, "tile", [2, 12, 8, 6])]))
    cond = g.add_op("GREATER", [x, g.const("zero", np.float32(0.0))], [g.add_tensor("positive", [2, 6, 8, 4], np.bool_)])
    relu = g.add_op("MAXIMUM", [x, g.const("zero_too", np.float32(0.0))], [_f(g, "relu", [2, 6, 8, 4])])
    outs.append(g.add_op("NOT_EQUAL", [relu, x], [g.add_tensor("negative", [2, 6, 8, 4], np.bool_)]))
    outs.append(g.add_op("SELECT_V2", [cond, x, g.const("minus_one", np.float32(-1.0))], [_f(g, "select_v2", [2, 6, 8, 4])]))
    outs.append(g.add_op("CAST", [x], [g.add_tensor("cast", [2, 6, 8, 4], I32)],
                         ("CastOptions", dict(in_data_type=TensorType.FLOAT32, out_data_type=TensorType.INT32))))
    g.inputs, g.outputs = [x, y], outs
    del rng
    return m


# -- 4. batch matmul, signatures, metadata ---------------------------------------------------
def batch_matmul_sig():
    rng = np.random.default_rng(105)
    m = ModelBuilder(description="MLIR Converted.")
    g = m.add_subgraph("main")
    a = g.add_tensor("serving_default_a:0", [2, 3, 4], F32, shape_signature=[-1, 3, 4])
    b = g.add_tensor("serving_default_b:0", [2, 5, 4], F32, shape_signature=[-1, 5, 4])
    mm = g.add_op("BATCH_MATMUL", [a, b], [g.add_tensor("model/matmul", [2, 3, 5], F32, shape_signature=[-1, 3, 5])],
                  ("BatchMatMulOptions", dict(adj_x=False, adj_y=True)))
    out = g.add_op("ADD", [mm, g.const("model/bias", _weights(rng, 5))],
                   [g.add_tensor("StatefulPartitionedCall:0", [2, 3, 5], F32, shape_signature=[-1, 3, 5])])
    g.inputs, g.outputs = [a, b], [out]
    m.add_signature("serving_default", 0, {"a": a, "b": b}, {"scores": out})
    d = m.add_subgraph("double")
    dx = d.add_tensor("double_x:0", [3], F32)
    dy = d.add_op("MUL", [dx, d.const("two", np.float32(2.0))], [d.add_tensor("StatefulPartitionedCall_1:0", [3], F32)])
    d.inputs, d.outputs = [dx], [dy]
    m.add_signature("double", 1, {"x": dx}, {"y": dy})
    m.add_metadata("min_runtime_version", b"1.5.0".ljust(16, b"\0"))
    return m


# -- 5. quantized models ---------------------------------------------------------------------
def _qparams(lo, hi, dtype=np.int8):
    """Asymmetric affine parameters covering [lo, hi] (widened to hold 0, rounded to 1/16)."""
    lo, hi = min(np.floor(lo * 16) / 16, 0.0), max(np.ceil(hi * 16) / 16, 0.0)
    qmin, qmax = (-128, 127) if dtype == np.int8 else (0, 255)
    scale = np.float32((hi - lo) / (qmax - qmin))
    zp = int(np.clip(np.round(qmin - lo / scale), qmin, qmax))
    return [float(scale)], [zp], 0


def _quantize(w, scale, zp, dtype):
    info = np.iinfo(dtype)
    return np.clip(np.round(w / scale) + zp, info.min, info.max).astype(dtype)


def _per_channel(w, axis):
    """Symmetric int8 weights per output channel along ``axis``, as TFLite's converter makes them."""
    other = tuple(i for i in range(w.ndim) if i != axis)
    scale = (np.abs(w).max(axis=other) / 127).astype(np.float32)
    shape = [1] * w.ndim
    shape[axis] = -1
    return np.clip(np.round(w / scale.reshape(shape)), -127, 127).astype(I8), scale


def _bias(b, in_scale, w_scale):
    scale = (np.float64(np.float32(in_scale)) * np.asarray(w_scale, np.float64)).astype(np.float32)
    q = np.round(b / scale.astype(np.float64)).astype(I32)
    return q, (scale.tolist(), [0] * scale.size, 0)


def calibrate(model, feeds):
    """{tensor name: (min, max)} over ``feeds`` (each a list of input arrays) from LiteRT's
    reference kernels; ``model`` is a ModelBuilder or a model's bytes."""
    from ai_edge_litert.interpreter import Interpreter, OpResolverType
    content = model if isinstance(model, bytes) else model.serialize()
    it = Interpreter(model_content=content, experimental_op_resolver_type=OpResolverType.BUILTIN_REF,
                     experimental_preserve_all_tensors=True)
    it.allocate_tensors()
    ranges = {}
    for feed in feeds:
        for detail, value in zip(it.get_input_details(), feed):
            it.set_tensor(detail["index"], value)
        it.invoke()
        for t in it.get_tensor_details():
            try:
                v = it.get_tensor(t["index"])
            except ValueError:
                continue
            if v.dtype != np.float32 or v.size == 0:
                continue
            lo, hi = ranges.get(t["name"], (np.inf, -np.inf))
            ranges[t["name"]] = (min(lo, float(v.min())), max(hi, float(v.max())))
    return ranges


class _Q:
    """Builds the same graph as float (ranges None) or quantized: activation tensors take int8
    parameters from calibration ranges, and weights are quantized by the given rule."""

    def __init__(self, g, ranges, dtype=I8):
        self.g, self.ranges, self.dtype = g, ranges, dtype

    def act(self, name, shape, quant=None):
        if self.ranges is None:
            return _f(self.g, name, shape)
        return self.g.add_tensor(name, shape, self.dtype, quant=quant or _qparams(*self.ranges[name], self.dtype))

    def quant_of(self, t):
        return self.g.tensors[t]["quant"]


def int8_conv(ranges=None):
    rng = np.random.default_rng(106)
    m = ModelBuilder()
    g = m.add_subgraph("main")
    q = _Q(g, ranges)
    w1, b1 = _weights(rng, 8, 3, 3, 3, scale=0.4), _weights(rng, 8, scale=0.1)
    wd, bd = _weights(rng, 1, 3, 3, 8, scale=0.4), _weights(rng, 8, scale=0.1)
    w2, b2 = _weights(rng, 8, 1, 1, 8, scale=0.4), _weights(rng, 8, scale=0.1)
    wf, bf = _weights(rng, 10, 72, scale=0.15), _weights(rng, 10, scale=0.1)
    x = _f(g, "input", [1, 12, 12, 3])
    v = 1 if ranges is None else 3  # op_version.cc: int8 per-channel CONV_2D / DEPTHWISE_CONV_2D

    def conv(op, src, name, w, b, axis, shape, opts):
        if ranges is None:
            wt, bt = g.const(f"{name}/w", w), g.const(f"{name}/b", b)
        else:
            wq, ws = _per_channel(w, axis)
            bq, bquant = _bias(b, q.quant_of(src)[0][0], ws)
            wt = g.const(f"{name}/w", wq, quant=(ws.tolist(), [0] * ws.size, axis))
            bt = g.const(f"{name}/b", bq, quant=bquant)
        return g.add_op(op, [src, wt, bt], [q.act(name, shape)], opts, version=v)

    if ranges is None:
        xq = x
    else:
        xq = g.add_op("QUANTIZE", [x], [g.add_tensor("input_int8", [1, 12, 12, 3], I8, quant=([2 / 255], [0], 0))], version=2)
    c1 = conv("CONV_2D", xq, "conv1", w1, b1, 0, [1, 12, 12, 8], _conv_opts(SAME, 1, Act.RELU))
    dw = conv("DEPTHWISE_CONV_2D", c1, "dw", wd, bd, 3, [1, 6, 6, 8], _conv_opts(SAME, 2, multiplier=1))
    c2 = conv("CONV_2D", dw, "pw", w2, b2, 0, [1, 6, 6, 8], _conv_opts(VALID))
    add = g.add_op("ADD", [dw, c2], [q.act("add", [1, 6, 6, 8])], ("AddOptions", dict(fused_activation_function=Act.NONE)),
                   version=1 if ranges is None else 2)
    same = None if ranges is None else q.quant_of(add)  # pooling and reshape keep their input's parameters
    ap = g.add_op("AVERAGE_POOL_2D", [add], [q.act("avgpool", [1, 3, 3, 8], same)], _pool_opts(VALID, 2, 2),
                  version=1 if ranges is None else 2)
    flat = g.add_op("RESHAPE", [ap, g.const("flatten/shape", [1, 72], I32)], [q.act("flatten", [1, 72], same)],
                    ("ReshapeOptions", dict(new_shape=[1, 72])))
    if ranges is None:
        wt, bt = g.const("fc/w", wf), g.const("fc/b", bf)
    else:
        ws = np.float32(np.abs(wf).max() / 127)
        bq, bquant = _bias(bf, same[0][0], [ws])
        wt = g.const("fc/w", _quantize(wf, ws, 0, I8), quant=([float(ws)], [0], 0))
        bt = g.const("fc/b", bq, quant=bquant)
    fc = g.add_op("FULLY_CONNECTED", [flat, wt, bt], [q.act("logits", [1, 10])],
                  ("FullyConnectedOptions", dict(fused_activation_function=Act.NONE)), version=1 if ranges is None else 4)
    sm = g.add_op("SOFTMAX", [fc], [q.act("probs_int8" if ranges else "probs", [1, 10], ([1 / 256], [-128], 0))],
                  ("SoftmaxOptions", dict(beta=1.0)), version=1 if ranges is None else 2)
    out = sm if ranges is None else g.add_op("DEQUANTIZE", [sm], [_f(g, "probs", [1, 10])], version=2)
    g.inputs, g.outputs = [x], [out]
    return m


def int8_io(ranges=None):
    rng = np.random.default_rng(107)
    m = ModelBuilder()
    g = m.add_subgraph("main")
    q = _Q(g, ranges)
    in_quant = ([0.05], [-10], 0)
    x = q.act("input", [1, 8, 8, 4], in_quant)
    mp = g.add_op("MAX_POOL_2D", [x], [q.act("maxpool", [1, 4, 4, 4], in_quant)], _pool_opts(SAME, 2, 2),
                  version=1 if ranges is None else 2)
    lg = g.add_op("LOGISTIC", [mp], [q.act("sigmoid", [1, 4, 4, 4], ([1 / 256], [-128], 0))],
                  version=1 if ranges is None else 2)
    branch = lg
    if ranges is not None:
        # LiteRT's int8 CONCATENATION wants every input at the output's scale (concatenation.cc),
        # so, as TFLite's converter does, the sigmoid branch is requantized int8 -> int8 first.
        branch = g.add_op("QUANTIZE", [lg], [q.act("sigmoid_requantized", [1, 4, 4, 4], in_quant)], version=2)
    cat = g.add_op("CONCATENATION", [mp, branch], [q.act("concat", [1, 4, 4, 8], in_quant)],
                   ("ConcatenationOptions", dict(axis=3)), version=1 if ranges is None else 2)
    c = rng.uniform(-1.5, 1.0, 8).astype(F32)
    if ranges is None:
        ct = g.const("mul/c", c)
    else:
        cq = _qparams(c.min(), c.max())
        ct = g.const("mul/c", _quantize(c, cq[0][0], cq[1][0], I8), quant=cq)
    out = g.add_op("MUL", [cat, ct], [q.act("output", [1, 4, 4, 8])], ("MulOptions", dict(fused_activation_function=Act.NONE)),
                   version=1 if ranges is None else 2)
    g.inputs, g.outputs = [x], [out, lg]
    return m


def uint8_fc(ranges=None):
    rng = np.random.default_rng(108)
    m = ModelBuilder()
    g = m.add_subgraph("main")
    q = _Q(g, ranges, dtype=U8)
    x = q.act("input", [1, 16], ([0.02], [128], 0))
    w, b = rng.uniform(-0.5, 0.8, (8, 16)).astype(F32), _weights(rng, 8, scale=0.1)
    if ranges is None:
        wt, bt = g.const("fc/w", w), g.const("fc/b", b)
    else:
        wquant = _qparams(w.min(), w.max(), U8)
        wt = g.const("fc/w", _quantize(w, wquant[0][0], wquant[1][0], U8), quant=wquant)
        bq, bquant = _bias(b, 0.02, wquant[0])
        bt = g.const("fc/b", bq, quant=bquant)
    fc = g.add_op("FULLY_CONNECTED", [x, wt, bt], [q.act("fc", [1, 8])], ("FullyConnectedOptions", dict(fused_activation_function=Act.NONE)))
    relu = g.add_op("RELU", [fc], [q.act("relu", [1, 8])])
    # uint8 CONCATENATION, unlike int8, takes inputs at scales other than the output's
    out = g.add_op("CONCATENATION", [fc, relu], [q.act("concat", [1, 16])], ("ConcatenationOptions", dict(axis=1)))
    g.inputs, g.outputs = [x], [out]
    return m


def _dequantized_feeds(rng, n, shape, scale, zp, dtype):
    info = np.iinfo(dtype)
    return [[((rng.integers(info.min, info.max + 1, shape) - zp) * scale).astype(F32)] for _ in range(n)]


def quantized_models():
    rng = np.random.default_rng(109)
    feeds = [[rng.uniform(-1, 1, (1, 12, 12, 3)).astype(F32)] for _ in range(16)]
    yield "int8_conv", int8_conv(calibrate(int8_conv(), feeds))
    yield "int8_io", int8_io(calibrate(int8_io(), _dequantized_feeds(rng, 16, (1, 8, 8, 4), 0.05, -10, I8)))
    yield "uint8_fc", uint8_fc(calibrate(uint8_fc(), _dequantized_feeds(rng, 16, (1, 16), 0.02, 128, U8)))


# -- 6. float16 weights (MediaPipe) ------------------------------------------------------------
def fp16_weights():
    rng = np.random.default_rng(110)
    m = ModelBuilder()
    g = m.add_subgraph("main")

    def fp16(name, w):
        half = g.const(f"{name}_fp16", w.astype(np.float16))
        return g.add_op("DEQUANTIZE", [half], [_f(g, name, list(w.shape))], version=3)

    x = _f(g, "input", [1, 8, 8, 3])
    c = g.add_op("CONV_2D", [x, fp16("conv/w", _weights(rng, 4, 3, 3, 3)), fp16("conv/b", _weights(rng, 4))],
                 [_f(g, "conv", [1, 4, 4, 4])], _conv_opts(SAME, 2, Act.RELU))
    dw = g.add_op("DEPTHWISE_CONV_2D", [c, fp16("dw/w", _weights(rng, 1, 3, 3, 4)), fp16("dw/b", _weights(rng, 4))],
                  [_f(g, "dw", [1, 4, 4, 4])], _conv_opts(SAME, 1, Act.RELU6, multiplier=1))
    flat = g.add_op("RESHAPE", [dw, g.const("flatten/shape", [1, 64], I32)], [_f(g, "flatten", [1, 64])])
    out = g.add_op("FULLY_CONNECTED", [flat, fp16("fc/w", _weights(rng, 5, 64, scale=0.2)), fp16("fc/b", _weights(rng, 5))],
                   [_f(g, "output", [1, 5])], ("FullyConnectedOptions", dict(fused_activation_function=Act.NONE)))
    g.inputs, g.outputs = [x], [out]
    return m


# -- 7. buffers past the FlatBuffer ----------------------------------------------------------
def external_buffers():
    rng = np.random.default_rng(111)
    m = ModelBuilder(external_buffers=True)
    g = m.add_subgraph("main")
    x = _f(g, "input", [1, 6, 6, 2])
    c = g.add_op("CONV_2D", [x, g.const("conv/w", _weights(rng, 4, 3, 3, 2)), g.const("conv/b", _weights(rng, 4))],
                 [_f(g, "conv", [1, 4, 4, 4])], _conv_opts(VALID, 1, Act.RELU))
    flat = g.add_op("RESHAPE", [c, g.const("flatten/shape", [1, 64], I32)], [_f(g, "flatten", [1, 64])])
    out = g.add_op("FULLY_CONNECTED", [flat, g.const("fc/w", _weights(rng, 3, 64, scale=0.2)), g.const("fc/b", _weights(rng, 3))],
                   [_f(g, "output", [1, 3])], ("FullyConnectedOptions", dict(fused_activation_function=Act.NONE)))
    g.inputs, g.outputs = [x], [out]
    return m


# -- 8. custom op ------------------------------------------------------------------------------
def custom_op():
    rng = np.random.default_rng(112)
    m = ModelBuilder()
    g = m.add_subgraph("main")
    x = _f(g, "input", [1, 8])
    a = g.add_op("ADD", [x, g.const("bias", _weights(rng, 8))], [_f(g, "add", [1, 8])])
    options = bytes(flexbuffers.Dumps({"alpha": 0.5, "mode": "fast"}))
    c = g.add_op("MyCustomOp", [a], [_f(g, "custom", [1, 8])], custom_options=options)
    out = g.add_op("TANH", [c], [_f(g, "output", [1, 8])])
    g.inputs, g.outputs = [x], [out]
    return m


# -- 8b. MediaPipe's landmark custom ops ---------------------------------------------------------
def mediapipe_landmarks():
    """The attention face mesh's crop step: a matrix fitted around landmarks
    (Landmarks2TransformMatrix), a conv's feature map sampled through it
    (TransformTensorBilinear), points mapped back (TransformLandmarks); version 2 of each,
    their options as MediaPipe's converter writes them."""
    rng = np.random.default_rng(113)
    m = ModelBuilder()
    g = m.add_subgraph("main")
    features, mesh, points = _f(g, "features", [1, 6, 7, 3]), _f(g, "mesh", [1, 12, 3]), _f(g, "points", [1, 5, 2])
    conv = g.add_op("CONV_2D", [features, g.const("conv/w", _weights(rng, 4, 1, 1, 3)), g.const("conv/b", _weights(rng, 4))],
                    [_f(g, "conv", [1, 6, 7, 4])], _conv_opts(VALID))
    fit = bytes(flexbuffers.Dumps({"left_rotation_idx": 1, "right_rotation_idx": 4, "subset_idxs": [0, 2, 3, 5, 7, 9, 11],
                                   "output_height": 4, "output_width": 5, "scale_x": 1.5, "scale_y": 1.25,
                                   "target_rotation_radians": 0.3}))
    matrix = g.add_op("Landmarks2TransformMatrix", [mesh], [_f(g, "matrix", [1, 4, 4])], custom_options=fit, version=2)
    size = bytes(flexbuffers.Dumps({"output_height": 4, "output_width": 5}))
    crop = g.add_op("TransformTensorBilinear", [conv, matrix], [_f(g, "crop", [1, 4, 5, 4])], custom_options=size,
                    version=2)
    back = g.add_op("TransformLandmarks", [points, matrix], [_f(g, "points_back", [1, 5, 2])], version=2)
    g.inputs, g.outputs = [features, mesh, points], [matrix, crop, back]
    return m


# -- 9. WHILE with cond and body subgraphs -----------------------------------------------------
def while_loop():
    m = ModelBuilder()
    main, cond, body = m.add_subgraph("main"), m.add_subgraph("cond"), m.add_subgraph("body")
    x = _f(main, "x", [2, 3])
    i0 = main.const("i0", np.int32(0))
    outs = main.add_op("WHILE", [i0, x], [main.add_tensor("i_final", [], I32), _f(main, "y", [2, 3])],
                       ("WhileOptions", dict(cond_subgraph_index=1, body_subgraph_index=2)))
    main.inputs, main.outputs = [x], list(outs)
    # cond: i < 10 and sum(|x|) < 100 (the counter bounds the loop for any input, zero included)
    ci, cx = cond.add_tensor("i", [], I32), _f(cond, "x", [2, 3])
    more = cond.add_op("LESS", [ci, cond.const("limit", np.int32(10))], [cond.add_tensor("i_less", [], np.bool_)])
    ab = cond.add_op("ABS", [cx], [_f(cond, "abs", [2, 3])])
    s = cond.add_op("SUM", [ab, cond.const("axes", [0, 1], I32)], [_f(cond, "sum", [])], ("ReducerOptions", dict(keep_dims=False)))
    small = cond.add_op("LESS", [s, cond.const("bound", np.float32(100.0))], [cond.add_tensor("sum_less", [], np.bool_)])
    go = cond.add_op("LOGICAL_AND", [more, small], [cond.add_tensor("continue", [], np.bool_)])
    cond.inputs, cond.outputs = [ci, cx], [go]
    bi, bx = body.add_tensor("i", [], I32), _f(body, "x", [2, 3])
    ni = body.add_op("ADD", [bi, body.const("one", np.int32(1))], [body.add_tensor("i_next", [], I32)])
    nx = body.add_op("MUL", [bx, body.const("two", np.float32(2.0))], [_f(body, "x_next", [2, 3])])
    body.inputs, body.outputs = [bi, bx], [ni, nx]
    return m


# fixture -> the custom op LiteRT names refusing it (MediaPipe registers its own in its graphs)
REFUSED = {"custom_op": "MyCustomOp", "mediapipe_landmarks": "Landmarks2TransformMatrix"}
FIXTURES = [conv_float, conv_dilated, transpose_conv, slicing, batch_matmul_sig, fp16_weights,
            external_buffers, custom_op, while_loop, global_pool, mediapipe_landmarks]


def _random_inputs(rng, details):
    feeds = {}
    for d in details:
        shape, dtype = d["shape"], d["dtype"]
        if np.issubdtype(dtype, np.floating):
            feeds[d["name"]] = rng.standard_normal(shape).astype(dtype)
        else:
            info = np.iinfo(dtype)
            feeds[d["name"]] = rng.integers(info.min, info.max + 1, shape).astype(dtype)
    return feeds


def check_with_litert(path, rng):
    """Load and invoke one fixture in LiteRT on random inputs (every signature, if it has any)."""
    from ai_edge_litert.interpreter import Interpreter
    it = Interpreter(model_path=str(path))
    it.allocate_tensors()
    for d, v in zip(it.get_input_details(), _random_inputs(rng, it.get_input_details()).values()):
        it.set_tensor(d["index"], v)
    it.invoke()
    outs = [it.get_tensor(d["index"]) for d in it.get_output_details()]
    assert all(np.all(np.isfinite(o)) for o in outs if o.dtype.kind == "f"), path
    for key, sig in it.get_signature_list().items():
        runner = it.get_signature_runner(key)
        details = runner.get_input_details()
        feeds = {name: v for name, v in zip(details, _random_inputs(
            rng, [dict(details[n], name=n) for n in details]).values())}
        result = runner(**feeds)
        assert sorted(result) == sorted(sig["outputs"]), (key, result.keys())
    return [o.shape for o in outs]


def main():
    start = time.perf_counter()
    written = []
    models = [(f.__name__, f()) for f in FIXTURES[:5]] + list(quantized_models()) + [(f.__name__, f()) for f in FIXTURES[5:]]
    for name, model in models:
        path = HERE / f"{name}.tflite"
        path.write_bytes(model.serialize())
        written.append(path)
    built = time.perf_counter() - start
    from ai_edge_litert.interpreter import Interpreter
    rng = np.random.default_rng(0)
    for path in written:
        if path.stem in REFUSED:
            try:
                Interpreter(model_path=str(path)).allocate_tensors()
            except RuntimeError as e:
                assert REFUSED[path.stem] in str(e), e
                print(f"{path.name:26s} {path.stat().st_size:7d} B  refused by LiteRT as expected (unresolved custom op)")
                continue
            raise AssertionError(f"LiteRT ran {path.name}")
        shapes = check_with_litert(path, rng)
        print(f"{path.name:26s} {path.stat().st_size:7d} B  LiteRT ok, outputs {[list(s) for s in shapes]}")
    total = sum(p.stat().st_size for p in written)
    print(f"{len(written)} fixtures, {total} B; built in {built:.2f} s, checked in {time.perf_counter() - start - built:.2f} s")


if __name__ == "__main__":
    main()
