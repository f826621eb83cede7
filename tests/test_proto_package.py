"""The gRPC API ships inside the package: the wheel holds the .proto files and the routing test
vectors, `embeddb proto-path` prints where they are installed, protoc compiles them from there
alone, and the files name their packages for Go and Java."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from click.testing import CliRunner
from grpc_tools import protoc

from embeddb.cli import main
from embeddb.v1 import embeddb_pb2, model_pb2

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ROOT / "embeddb" / "proto"
FILES = [
    "embeddb/v1/embeddb.proto",
    "embeddb/v1/model.proto",
    "embeddb/v1/routing_test_vectors.json",
]


@pytest.mark.slow
def test_the_wheel_ships_the_proto_files(tmp_path: Path) -> None:
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", str(tmp_path), str(ROOT)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    if built.returncode != 0 and "No module named" in built.stderr:
        pytest.skip(f"cannot build a wheel here: {built.stderr.strip()[-200:]}")
    assert built.returncode == 0, built.stderr
    (wheel,) = tmp_path.glob("embeddb_recsys-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        for name in FILES:
            assert archive.read(f"embeddb/proto/{name}") == (SOURCES / name).read_bytes(), name


def test_proto_path_prints_a_directory_protoc_compiles_from(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["proto-path"])
    assert result.exit_code == 0, result.output
    root = Path(result.output.strip())
    assert all((root / name).is_file() for name in FILES)

    include = Path(protoc.__file__).parent / "_proto"  # google/protobuf/*.proto only
    out = tmp_path / "api.pb"
    code = protoc.main(["protoc", f"-I{root}", f"-I{include}",
                        f"--descriptor_set_out={out}", "embeddb/v1/embeddb.proto",
                        "embeddb/v1/model.proto"])  # fmt: skip
    assert code == 0 and out.stat().st_size > 0


def test_the_files_name_their_go_and_java_packages() -> None:
    for module in (embeddb_pb2, model_pb2):
        options = module.DESCRIPTOR.GetOptions()
        assert options.go_package.endswith("/embeddb/v1;embeddbv1")
        assert options.java_package == "io.embeddb.v1" and options.java_multiple_files
