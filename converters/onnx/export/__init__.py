"""edgeflow -> ONNX: `export(src, dst, signature)` writes one signature of a `.efl` model as an
ONNX model (opset 24, one graph) that onnxruntime runs and Netron opens.

The signature's inputs become the graph's inputs and its outputs the graph's outputs, under
their signature names; a dynamic dimension (-1) is the symbolic one `<name>_dim<k>`. Only
the ops the outputs need are written. Constants and variables (at the values the file
holds: a trained package's current weights) become initializers; a weight stored int8
(the format's quantization fields) is its int8 initializer through DequantizeLinear, one
stored float16 the Cast the file already has.

Each op goes through the exporter registered under its name, in the module named like the
edgeflow/ops module that defines it (as the converter's handlers): a function named like
the op (`@exporter`; a trailing _ is dropped: `if_`), a function shared by the ops of a
table (`@exporter(TABLE)`), or an entry of the module's SAME table, an op written as one
ONNX node of the same inputs, outputs and attributes. The fused activation of conv,
matmul and add (`activation`) is a Relu or Clip after the op's node, for every op at once.
An op with no ONNX form fails the export with one UnsupportedOpError that lists them all.
"""
import functools
from dataclasses import dataclass

import numpy as np

from edgeflow import dtypes, ops
from edgeflow.errors import ConversionError, UnsupportedOpError

OPSET = 24  # Attention's nonpad_kv_seqlen and Swish (24), Gelu (20), RotaryEmbedding (23)
TRAINING = ("train", "save", "restore")  # signatures of a trainable package besides infer

EXPORTERS = {}  # edgeflow op name -> fn(graph, op)
MODULES = {}  # edgeflow op name -> the module whose exporter writes it

# Ops with no exporter, by kind: what OpDef says of them (stateful, remote, a gradient op)
# or, for the others, why.
NOT_AT_OPSET = {"bitcast": "ONNX's BitCast is opset 26", "cumprod": "ONNX's CumProd is opset 26"}
GRADIENT_OPS = ("sum_to",)  # gradient ops not named <forward>_grad
TRAINING_OPS = ("adam_update",)  # an optimizer's step (edgeflow/ops/optim.py)


def why_not(name):
    """Why op `name` has no ONNX form here."""
    opdef = ops.find(name)
    if opdef is not None and opdef.stateful:
        return "writes a variable in place, which an ONNX graph cannot (export a signature that does not train)"
    if opdef is not None and opdef.remote:
        return "exchanges tensors with the cloud (export the whole model, not a split device package)"
    if name.endswith("_grad") or name in GRADIENT_OPS:
        return "a gradient op, which only training signatures run (export infer)"
    if name in TRAINING_OPS:
        return "an optimizer's step, which only training signatures run (export infer)"
    return NOT_AT_OPSET.get(name, "no ONNX form in this exporter")


def _register(name, fn, module):
    ops.get(name)  # a name that is no op fails at import
    if name in EXPORTERS:
        raise AssertionError(f"two exporters for op {name!r}")
    EXPORTERS[name], MODULES[name] = fn, module


def exporter(arg):
    """Register `fn(graph, op)` as the ONNX form of edgeflow ops: `@exporter` for the op the
    function is named after, `@exporter(TABLE)` for each op the keys of TABLE name."""
    if callable(arg):
        _register(arg.__name__.rstrip("_"), arg, arg.__module__)
        return arg

    def register(fn):
        for name in arg:
            _register(name, fn, fn.__module__)
        return fn
    return register


def onnx_attrs(attrs):
    """edgeflow attribute values as ONNX's: bools as ints, dtypes as TensorProto codes; None
    and empty tuples (ONNX's defaults) left out."""
    out = {}
    for key, value in attrs.items():
        if value is None or (isinstance(value, tuple) and not value):
            continue
        if isinstance(value, (bool, np.bool_)):
            value = int(value)
        elif isinstance(value, np.dtype):
            value = elem_type(value)
        elif isinstance(value, tuple):
            value = list(value)
        out[key] = value
    return out


def _same(onnx_type):
    def export(g, op):
        inputs = [g.cast(name, spec.dtype, np.int64) if spec.dtype == np.int32 and _int64_only(onnx_type, i)
                  else name for i, (name, spec) in enumerate(zip(op.inputs, op.input_specs))]
        g.node(onnx_type, inputs, op.outputs, **onnx_attrs(op.attrs))
    return export


@functools.lru_cache(maxsize=None)
def _int64_only(onnx_type, i):
    """Whether input `i` of ONNX's `onnx_type` takes int64 indices but not the int32 ones
    edgeflow also takes (GatherND's, Expand's shape, ...)."""
    from onnx import defs
    schema = defs.get_schema(onnx_type, OPSET)
    formal = schema.inputs[min(i, len(schema.inputs) - 1)]
    allowed = next((set(c.allowed_type_strs) for c in schema.type_constraints
                    if c.type_param_str == formal.type_str), {formal.type_str})
    return "tensor(int64)" in allowed and "tensor(int32)" not in allowed


def elem_type(dtype):
    """The TensorProto element type of numpy `dtype` (edgeflow's bfloat16 included)."""
    from onnx import TensorProto, helper
    dtype = np.dtype(dtype)
    return TensorProto.BFLOAT16 if dtype == dtypes.bfloat16 else helper.np_dtype_to_tensor_dtype(dtype)


def tensor_proto(array, name):
    """A TensorProto of `array` (edgeflow's bfloat16: its bits)."""
    from onnx import TensorProto, numpy_helper
    array = np.asarray(array)
    if array.dtype != dtypes.bfloat16:
        return numpy_helper.from_array(np.array(array, order="C", copy=not array.flags.c_contiguous), name)
    proto = TensorProto(name=name, data_type=TensorProto.BFLOAT16, dims=array.shape)
    proto.raw_data = np.array(array["bfloat16"], "<u2", order="C").tobytes()
    return proto


def value_info(name, dtype, shape, dim_name=None):
    """A ValueInfoProto; unknown dimensions (-1 or None) named `dim_name(k)`, or left unnamed."""
    from onnx import helper
    dims = [d if d is not None and d >= 0 else (dim_name(k) if dim_name else None) for k, d in enumerate(shape)]
    return helper.make_tensor_value_info(name, elem_type(dtype), dims)


@dataclass
class Op:
    """What an exporter sees of an edgeflow op: its attributes (defaults filled in, the fused
    activation taken out), the ONNX names of its inputs and outputs, and their specs (shape
    with None where dynamic, dtype, and the value of a constant input)."""

    opcode: str
    attrs: dict
    inputs: list
    outputs: list
    input_specs: list
    output_specs: list
    where: str
    operands: dict  # attribute -> the ONNX name of the input that gives it (OpDef.operands)

    def value(self, i):
        """The value of input `i` if it is a constant, else None."""
        return self.input_specs[i].value if i < len(self.input_specs) else None


def unsupported(op, why):
    """The UnsupportedOpError for a variant of an op that ONNX cannot say."""
    return UnsupportedOpError(f"{op.where}: {why}", [(op.opcode, why, op.where)])


class Graph:
    """One ONNX graph being written (the main graph, an If branch, a Loop body): its nodes
    in order and its initializers. Names are unique across the whole model."""

    def __init__(self, export):
        self.export, self.model = export, export.model
        self.nodes, self.initializers, self.made = [], [], set()
        self.scope = "graph"  # the op being written: new names start with its output's name

    def fresh(self, hint):
        return self.export.fresh(hint)

    def node(self, op_type, inputs, outputs=None, **attrs):
        """Append an ONNX node; its outputs are `outputs` (names), or one new name. Returns
        the (first) output's name."""
        from onnx import helper
        outputs = list(outputs) if outputs is not None else [self.fresh(f"{self.scope}/{op_type}")]
        self.nodes.append(helper.make_node(op_type, list(inputs), outputs, name=outputs[0] or op_type, **attrs))
        self.made.update(outputs)
        return outputs[0]

    def initializer(self, value, hint):
        """The name (`hint`, made unique) of a new initializer holding `value`."""
        name = self.fresh(hint)
        self.initializers.append(tensor_proto(value, name))
        return name

    def const(self, value, hint="const"):
        """An initializer of the op being written."""
        return self.initializer(value, f"{self.scope}/{hint}")

    def given(self, op, attr, dtype, shape=None):
        """The input giving attribute `attr` of `op`: its operand where it has one (int32 ones
        cast where `dtype` is int64: ONNX takes int64 shapes and axes), else the attribute's
        value as an initializer of `dtype` (reshaped to `shape` if given)."""
        if attr in op.operands:
            name = op.operands[attr]
            held = op.input_specs[op.inputs.index(name)].dtype
            return self.cast(name, held, dtype) if held == np.int32 and dtype == np.int64 else name
        value = np.array(op.attrs[attr], dtype)
        return self.const(value if shape is None else value.reshape(shape), attr)

    def cast(self, name, dtype, to):
        """`name` (of `dtype`) as `to`: itself, or a Cast."""
        return name if np.dtype(dtype) == np.dtype(to) else self.node("Cast", [name], to=elem_type(to))

    def scalar(self, name, rank):
        """`name` as a scalar: reshaped to () if it has one element at `rank` > 0."""
        if rank == 0:
            return name
        return self.node("Reshape", [name, self.const(np.zeros(0, np.int64), "scalar_shape")])

    def child(self):
        """A graph for a subgraph of the op being written (an If branch, a Loop body)."""
        child = Graph(self.export)
        child.scope = self.scope
        return child

    def emit(self, subgraph, names, fetches, targets=(), fed=None):
        """Write the ops of edgeflow subgraph `subgraph` (an index) that tensors `fetches`
        and operators `targets` need, reading the tensors `fed` (default: all that `names`
        names; `names`, {index: ONNX name}, gets the names of the tensors written); returns
        the names of `fetches`."""
        sg = self.model.subgraphs[subgraph]
        for i in _needed(sg, fetches, targets, set(names) if fed is None else fed):
            self._op(sg, sg.operators[i], names)
        return [self._value(sg, names, t) for t in fetches]

    def inline(self, subgraph, inputs):
        """The names of subgraph `subgraph`'s outputs, its ops written here on `inputs`."""
        sg = self.model.subgraphs[subgraph]
        return self.emit(subgraph, dict(zip(sg.inputs, inputs)), sg.outputs)

    def outputs(self, names, specs, rename=None):
        """ValueInfoProtos of this graph's outputs: the values `names`, under the names `rename`
        where given. Each output is a value of its own: an Identity copies one that is renamed,
        repeated, or (in a subgraph) not made by this graph's nodes."""
        seen, out = set(), []
        for k, (name, spec) in enumerate(zip(names, specs)):
            target = rename[k] if rename else name
            if name != target or name in seen or (not rename and name not in self.made):
                name = self.node("Identity", [name], [target if rename else self.fresh(f"{name}/out")])
            seen.add(name)
            out.append(value_info(name, spec.dtype, spec.shape))
        return out

    def graph(self, name, inputs, outputs):
        from onnx import helper
        return helper.make_graph(self.nodes, name, inputs, outputs, self.initializers)

    def _value(self, sg, names, t):
        """The ONNX name of tensor `t` of `sg`: a constant's initializer is written on first use."""
        if t in names:
            return names[t]
        tensor = sg.tensors[t]
        if tensor.data is None:
            raise ConversionError(f"tensor {tensor.name!r} is read but neither fed nor computed by the "
                                  "signature's ops")
        q = tensor.quantization
        if q is None:
            names[t] = self.initializer(tensor.data, tensor.name)
            return names[t]
        scale = np.asarray(q.scale, np.float32).reshape(() if q.axis < 0 else (-1,))
        parts = [self.initializer(tensor.data, f"{tensor.name}/{dtypes.name(tensor.dtype)}"),
                 self.initializer(scale, f"{tensor.name}/scale")]
        if q.zero_point:
            parts.append(self.initializer(np.asarray(q.zero_point, tensor.dtype).reshape(scale.shape),
                                          f"{tensor.name}/zero_point"))
        names[t] = self.node("DequantizeLinear", parts, [self.fresh(tensor.name)],
                             **({"axis": q.axis} if q.axis >= 0 else {}))
        return names[t]

    def _op(self, sg, op, names):
        """Write edgeflow op `op` of `sg` through its exporter; record it in the export's
        failures if it has no ONNX form."""
        named = op.outputs or op.inputs  # an op without outputs (a variable write) by its first input
        where = f"{op.opcode} {sg.tensors[named[0]].name!r}" if named else op.opcode
        outputs = [names.setdefault(t, self.fresh(sg.tensors[t].name)) for t in op.outputs]
        if op.opcode not in EXPORTERS:
            self.export.failed.append((op.opcode, why_not(op.opcode), where))
            return
        opdef = ops.get(op.opcode)
        attrs = opdef.check_attrs(op.attrs, len(op.inputs))
        inputs = [self._value(sg, names, t) for t in op.inputs]
        own = len(inputs) - opdef.operand_inputs(len(inputs))
        view = Op(op.opcode, attrs, inputs, outputs, [spec_of(sg.tensors[t]) for t in op.inputs],
                  [spec_of(sg.tensors[t]) for t in op.outputs], where, dict(zip(opdef.operands, inputs[own:])))
        self.scope = outputs[0] if outputs else op.opcode
        activation = attrs.pop("activation", "")
        if activation:  # the op's node writes a value of its own, the activation the output
            view.outputs = [self.fresh(f"{outputs[0]}/{op.opcode}")] + outputs[1:]
        try:
            EXPORTERS[op.opcode](self, view)
        except UnsupportedOpError as e:
            self.export.failed.extend(e.ops)
            return
        if activation == "relu":
            self.node("Relu", view.outputs[:1], outputs[:1])
        elif activation == "relu6":
            dt = view.output_specs[0].dtype
            bounds = [self.const(np.array(0, dt), "zero"), self.const(np.array(6, dt), "six")]
            self.node("Clip", view.outputs[:1] + bounds, outputs[:1])
        elif activation == "swish":
            self.node("Swish", view.outputs[:1], outputs[:1])
        elif activation == "hard_swish":
            self.node("HardSwish", view.outputs[:1], outputs[:1])


def spec_of(tensor):
    """The TensorSpec of a tensor as an ONNX value: a quantized constant is its float32 values."""
    dtype = np.dtype(np.float32) if tensor.quantization is not None else tensor.dtype
    value = tensor.data if tensor.quantization is None and not tensor.is_variable else None
    return ops.TensorSpec(tuple(None if d < 0 else d for d in tensor.shape), dtype, value)


def _needed(sg, fetches, targets, fed):
    """Indices of the operators of `sg` that `fetches` and `targets` need, in an order that
    runs each after those whose outputs it reads; fed tensors are not computed."""
    producer = {t: i for i, op in enumerate(sg.operators) for t in op.outputs}
    order, state = [], {}
    stack = [(i, False) for i in reversed(list(targets))]
    stack += [(producer[t], False) for t in reversed(list(fetches)) if t in producer and t not in fed]
    while stack:
        i, done = stack.pop()
        if done:
            if state[i] != "done":
                state[i] = "done"
                order.append(i)
            continue
        if i in state:
            continue
        state[i] = "open"
        stack.append((i, True))
        for t in reversed(sg.operators[i].inputs):
            if t in producer and t not in fed and producer[t] not in state:
                stack.append((producer[t], False))
    return order


class _Export:
    """The model-wide state of one export: names taken and the ops that failed."""

    def __init__(self, model):
        self.model, self.taken, self.failed = model, set(), []

    def fresh(self, hint):
        """`hint`, or `hint_2`, `hint_3`... where it is taken: a name no other value has."""
        name, k = hint, 1
        while name in self.taken or not name:
            k += 1
            name = f"{hint}_{k}"
        self.taken.add(name)
        return name


def signature_of(model, key=None):
    """The SignatureDef to export: `key`, else infer, else the first that does not train."""
    found = {s.key: s for s in model.signatures}
    if key is not None:
        if key not in found:
            raise ConversionError(f"no signature {key!r}; the model has {', '.join(found) or 'none'}")
        return found[key]
    if "infer" in found:
        return found["infer"]
    plain = [s for s in model.signatures if s.key not in TRAINING and not s.targets]
    if not plain:
        raise ConversionError(f"the model has no inference signature (it has {', '.join(found) or 'none'}); "
                              "name one")
    return plain[0]


def to_onnx(model, signature=None):
    """The onnx.ModelProto of signature `signature` (see signature_of) of ModelDef `model`."""
    import onnx
    from onnx import helper
    from edgeflow import __version__
    sig = signature_of(model, signature)
    sg = model.subgraphs[sig.subgraph]
    state = _Export(model)
    state.taken.update(sig.inputs)
    state.taken.update(sig.outputs)
    g = Graph(state)
    names = {t: key for key, t in sig.inputs.items()}
    made = {t for op in sg.operators for t in op.outputs}
    for key, t in sig.outputs.items():  # an output an op makes takes its signature name
        if t not in names and t in made:
            names[t] = key
    fetched = g.emit(sig.subgraph, names, list(sig.outputs.values()), sig.targets, set(sig.inputs.values()))
    if state.failed:
        _raise_unsupported(state.failed)
    inputs = [value_info(key, sg.tensors[t].dtype, sg.tensors[t].shape, lambda d, k=key: f"{k}_dim{d}")
              for key, t in sig.inputs.items()]
    outputs = g.outputs(fetched, [spec_of(sg.tensors[t]) for t in sig.outputs.values()], list(sig.outputs))
    model_proto = helper.make_model(
        g.graph(sig.key, inputs, outputs), opset_imports=[helper.make_opsetid("", OPSET)],
        producer_name="edgeflow", producer_version=__version__, doc_string=model.description)
    model_proto.ir_version = helper.find_min_ir_version_for(list(model_proto.opset_import))
    _name_dynamic_dims(model_proto)
    try:
        onnx.checker.check_model(model_proto)
    except onnx.checker.ValidationError as e:
        raise ConversionError(f"the exported graph is not valid ONNX: {str(e).splitlines()[0]}") from None
    return model_proto


def _name_dynamic_dims(model_proto):
    """Name each dynamic dimension of the graph's outputs: as ONNX's shape inference traces
    it to an input's (the batch of an output is the input's `x_dim0`), else `<output>_dim<k>`."""
    import onnx
    try:
        inferred = {v.name: v for v in onnx.shape_inference.infer_shapes(model_proto).graph.output}
    except Exception:  # noqa: BLE001 (inference is a nicety here; the checker judges the model)
        inferred = {}
    named = {d.dim_param for v in model_proto.graph.input for d in v.type.tensor_type.shape.dim}
    for out in model_proto.graph.output:
        dims = out.type.tensor_type.shape.dim
        traced = inferred.get(out.name)
        traced = traced.type.tensor_type.shape.dim if traced is not None else []
        for k, d in enumerate(dims):
            if not d.HasField("dim_value") and not d.HasField("dim_param"):
                given = traced[k].dim_param if len(traced) == len(dims) else ""
                d.dim_param = given if given in named and given else f"{out.name}_dim{k}"


def _raise_unsupported(failed):
    by_op = {}
    for opcode, why, where in failed:
        by_op.setdefault((opcode, why), []).append(where)
    lines = [f"  {op}: {why} ({', '.join(wheres[:4])}{f' and {len(wheres) - 4} more' if len(wheres) > 4 else ''})"
             for (op, why), wheres in sorted(by_op.items())]
    raise UnsupportedOpError(f"{len(by_op)} edgeflow op(s) have no ONNX form at opset {OPSET}:\n" + "\n".join(lines),
                             failed)


def export(src, dst=None, signature=None):
    """The ONNX ModelProto of signature `signature` (default: infer, else the first that does
    not train) of the `.efl` model `src` (a path, bytes, or a ModelDef); written to `dst`
    (atomically) if given. FormatError for a bad file, ConversionError for an unknown
    signature, UnsupportedOpError listing every op with no ONNX form."""
    from edgeflow.atomic import write_bytes
    from edgeflow.format import reader
    from edgeflow.format.model import ModelDef
    model = src if isinstance(src, ModelDef) else reader.load(src)
    proto = to_onnx(model, signature)
    if dst is not None:
        write_bytes(dst, proto.SerializeToString())
    return proto


from . import (activations, array, attention, control, conv, einsum, geometry, image, loss, math, nn, norm,  # noqa: E402
               pool, quantize, random, reduce, rnn, select, shape, signal)

for _module in (activations, array, attention, control, conv, einsum, image, loss, math, nn, norm, pool, quantize,
                random, reduce, rnn, select, shape, signal):
    for _name, _type in getattr(_module, "SAME", {}).items():
        _register(_name, _same(_type), _module.__name__)
