"""What both converters share: the report of a conversion, its progress bar, and the
step from an edgeflow Graph to a (quantized) `.efl` file."""
import os
from collections import Counter
from dataclasses import dataclass, field

from edgeflow.errors import ConversionError, GraphError

QUANTIZE_MODES = (None, "fp16", "int8")


@dataclass
class Conversion:
    """What `convert` made, and figures for the report."""

    model: object  # edgeflow.format.model.ModelDef
    source_ops: Counter  # op types of the source model
    ops: Counter
    parameters: int
    source_bytes: int
    efl_bytes: int = 0
    path: str = ""
    source_format: str = "ONNX"
    notes: list = field(default_factory=list)


def check_quantize(quantize):
    if quantize not in QUANTIZE_MODES:
        raise ConversionError(f"quantize must be None, 'fp16' or 'int8', got {quantize!r}")


def progress(items, enabled, desc="converting", unit="node"):
    """`items`, with a tqdm progress bar when enabled and worth it (200 items or more)."""
    if not enabled or len(items) < 200:
        return items
    try:
        from tqdm import tqdm
    except ImportError:
        return items
    return tqdm(items, desc=desc, unit=unit, leave=False)


def package(graph, signatures, description, producer, dst, quantize, source_ops, source_bytes,
            source_format, fp16_exact=False):
    """The Conversion of `graph`: its ModelDef, quantized if asked (fp16_exact: store as
    float16 the weights that float16 holds exactly), written to `dst` if given."""
    import edgeflow as ef
    from edgeflow.format import quantize as quantization, writer
    try:
        model = ef.to_model(graph, signatures, description=description)
    except GraphError as e:
        raise ConversionError(str(e)) from None
    model.producer = producer
    model = quantization.absorb_dequantize(model)  # integer weights: the format's quantization fields
    if quantize:
        model = quantization.quantize(model, quantize)
    elif fp16_exact:
        model = quantization.quantize(model, "fp16", exact_only=True)
    result = Conversion(model, source_ops, Counter(op.opcode for op in model.subgraphs[0].operators),
                        parameters(model), source_bytes, source_format=source_format)
    if dst is not None:
        writer.write(model, dst)
        result.path, result.efl_bytes = os.fspath(dst), os.path.getsize(dst)
    return result


def parameters(model):
    """How many weights the model holds (float constants and quantized ones)."""
    import numpy as np
    return int(sum(np.prod(t.shape, dtype=np.int64) for t in model.subgraphs[0].tensors
                   if t.data is not None and (t.data.dtype.kind == "f" or t.quantization is not None)))
