"""A MediaPipe model's outputs as MediaPipe itself computes them, custom ops included.

    PYTHON_WITH_MEDIAPIPE benchmarks/mediapipe_reference.py MODEL.tflite OUT.npz
        [--outputs N] [--seed S] [--height H --width W]

LiteRT cannot run a model with MediaPipe's custom ops (face_landmark_with_attention's
Landmarks2TransformMatrix, TransformTensorBilinear, TransformLandmarks): they are
registered by MediaPipe's own inference graph. This script runs that graph
(TfLiteCustomOpResolverCalculator's op resolver, InferenceCalculator with TFLite's
builtin kernels) on a seeded random RGB image of the model's input size, which
ImageToTensorCalculator turns into the float tensor image / 255 (no resampling at that
size), and writes `input` (that tensor, NHWC with a batch of 1) and `output_0`..
`output_{N-1}` (flat, in the model's output order) to OUT.npz.

It runs under a Python with `mediapipe` installed (0.10.14, the wheel bench_tflite.py takes
its models from), which edgeflow's own environment need not have: bench_tflite.py
`--mediapipe-python PATH` runs it in a subprocess. It imports nothing of edgeflow.
"""
import argparse

import numpy as np


def graph_config(outputs, height, width):
    """MediaPipe's CalculatorGraphConfig text: image -> tensor -> the model -> N float lists."""
    split = ('node { calculator: "SplitTensorVectorCalculator" input_stream: "output_tensors" '
             + "".join(f'output_stream: "t{i}" ' for i in range(outputs))
             + "options: { [mediapipe.SplitVectorCalculatorOptions.ext] { "
             + "".join(f"ranges: {{ begin: {i} end: {i + 1} }} " for i in range(outputs)) + "} } }\n")
    floats = "".join(f'node {{ calculator: "TensorsToFloatsCalculator" input_stream: "TENSORS:t{i}" '
                     f'output_stream: "FLOATS:f{i}" }}\n' for i in range(outputs))
    return ('input_stream: "image"\n' + "".join(f'output_stream: "f{i}"\n' for i in range(outputs)) + f"""
node {{ calculator: "TfLiteCustomOpResolverCalculator" output_side_packet: "OP_RESOLVER:op_resolver" }}
node {{ calculator: "LocalFileContentsCalculator" input_side_packet: "FILE_PATH:model_path"
       output_side_packet: "CONTENTS:model_blob" }}
node {{ calculator: "TfLiteModelCalculator" input_side_packet: "MODEL_BLOB:model_blob"
       output_side_packet: "MODEL:model" }}
node {{ calculator: "ImageToTensorCalculator" input_stream: "IMAGE:image" output_stream: "TENSORS:input_tensors"
  options: {{ [mediapipe.ImageToTensorCalculatorOptions.ext] {{ output_tensor_width: {width}
    output_tensor_height: {height} keep_aspect_ratio: false output_tensor_float_range {{ min: 0.0 max: 1.0 }} }} }} }}
node {{ calculator: "InferenceCalculator" input_stream: "TENSORS:input_tensors" output_stream: "TENSORS:output_tensors"
  input_side_packet: "MODEL:model" input_side_packet: "OP_RESOLVER:op_resolver"
  options: {{ [mediapipe.InferenceCalculatorOptions.ext] {{ delegate {{ tflite {{}} }} }} }} }}
""" + split + floats)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("out")
    parser.add_argument("--outputs", type=int, default=1, help="how many of the model's outputs (default 1)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--height", type=int, default=192)
    parser.add_argument("--width", type=int, default=192)
    args = parser.parse_args()

    import mediapipe as mp
    from google.protobuf import text_format
    from mediapipe.framework import calculator_pb2
    from mediapipe.python import packet_creator, packet_getter

    config = text_format.Parse(graph_config(args.outputs, args.height, args.width),
                               calculator_pb2.CalculatorGraphConfig())
    graph = mp.CalculatorGraph(graph_config=config)
    got = {}
    for i in range(args.outputs):
        graph.observe_output_stream(f"f{i}", lambda stream, packet: got.__setitem__(
            stream, np.array(packet_getter.get_float_list(packet), np.float32)))
    graph.start_run(input_side_packets={"model_path": packet_creator.create_string(args.model)})
    image = np.random.RandomState(args.seed).randint(0, 256, (args.height, args.width, 3)).astype(np.uint8)
    frame = packet_creator.create_image_frame(image_format=mp.ImageFormat.SRGB, data=image)
    graph.add_packet_to_input_stream("image", frame.at(0))
    graph.close()
    missing = [i for i in range(args.outputs) if f"f{i}" not in got]
    if missing:
        raise SystemExit(f"MediaPipe gave no output {missing}")
    np.savez(args.out, input=(image.astype(np.float32) / np.float32(255))[None],
             **{f"output_{i}": got[f"f{i}"] for i in range(args.outputs)})


if __name__ == "__main__":
    main()
