"""Generate the Python gRPC stubs from embeddb/proto/ (the .proto files, shipped in the package)
into embeddb/v1/.

Run from anywhere: ``python proto/generate.py``. With ``--check DIR`` it generates into DIR
instead and exits 1 if the result differs from the committed stubs (tests/test_proto.py does
this, so a .proto edit without regenerating fails CI). The pinned grpcio-tools version makes
the output reproducible.
"""

from __future__ import annotations

import argparse
import filecmp
import sys
from pathlib import Path

from grpc_tools import protoc

ROOT = Path(__file__).resolve().parents[1]
PROTO_DIR = ROOT / "embeddb" / "proto"
SOURCES = ["embeddb/v1/embeddb.proto", "embeddb/v1/model.proto"]
GENERATED = [
    f"{Path(source).stem}{suffix}"
    for source in SOURCES
    for suffix in ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py")
]


def generate(out: Path) -> None:
    """Run protoc for every source into ``out`` (mirroring the package path)."""
    out.mkdir(parents=True, exist_ok=True)
    include = str(Path(protoc.__file__).parent / "_proto")
    args = [
        "grpc_tools.protoc",
        f"-I{PROTO_DIR}",
        f"-I{include}",
        f"--python_out={out}",
        f"--pyi_out={out}",
        f"--grpc_python_out={out}",
        *SOURCES,
    ]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")


def stale(fresh: Path) -> list[str]:
    """Names of generated files that differ between ``fresh`` and the committed ones."""
    return [
        name
        for name in GENERATED
        if not filecmp.cmp(fresh / "embeddb/v1" / name, ROOT / "embeddb/v1" / name, shallow=False)
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", type=Path, help="generate here and compare; exit 1 if stale")
    args = parser.parse_args()
    if args.check is None:
        generate(ROOT)
        return 0
    generate(args.check)
    differ = stale(args.check)
    if differ:
        print(f"stale generated stubs: {', '.join(differ)}; run python proto/generate.py")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
