"""The committed edgeflow_pb2*.py and ps_pb2*.py are what generate.sh makes from edgeflow.proto
and ps.proto."""
import pathlib
import subprocess
import sys


CLOUD = pathlib.Path(__file__).parents[2] / "edgeflow" / "cloud"
GENERATED = ["edgeflow_pb2.py", "edgeflow_pb2_grpc.py", "ps_pb2.py", "ps_pb2_grpc.py"]


def test_generated_code_is_up_to_date(tmp_path):
    root = CLOUD.parents[1]
    subprocess.run([sys.executable, "-m", "grpc_tools.protoc", "-I", str(root), f"--python_out={tmp_path}",
                    f"--grpc_python_out={tmp_path}", str(CLOUD / "edgeflow.proto"), str(CLOUD / "ps.proto")],
                   check=True)
    for name in GENERATED:
        fresh = (tmp_path / "edgeflow" / "cloud" / name).read_text()
        assert fresh == (CLOUD / name).read_text(), f"{name} is stale: run edgeflow/cloud/generate.sh"


def test_generated_code_imports_as_a_package():
    from edgeflow.cloud import edgeflow_pb2, edgeflow_pb2_grpc
    assert edgeflow_pb2_grpc.edgeflow_dot_cloud_dot_edgeflow__pb2 is edgeflow_pb2  # not a top-level module
    assert edgeflow_pb2.DESCRIPTOR.services_by_name["Edgeflow"].full_name == "edgeflow.v1.Edgeflow"
    methods = edgeflow_pb2.DESCRIPTOR.services_by_name["Edgeflow"].methods_by_name
    assert set(methods) == {"Run", "RunOnce", "ListModels", "Ping"}


def test_parameter_server_code_imports_as_a_package():
    from edgeflow.cloud import edgeflow_pb2, ps_pb2, ps_pb2_grpc
    assert ps_pb2_grpc.edgeflow_dot_cloud_dot_ps__pb2 is ps_pb2
    assert ps_pb2.DESCRIPTOR.dependencies[0] is edgeflow_pb2.DESCRIPTOR  # chunks are edgeflow.v1.TensorChunk
    service = ps_pb2.DESCRIPTOR.services_by_name["ParameterServer"]
    assert service.full_name == "edgeflow.ps.v1.ParameterServer"
    assert set(service.methods_by_name) == {"Status", "Pull", "Push", "PushModel"}
