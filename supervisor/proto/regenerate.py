"""Regenerate the committed gRPC stubs beside it from supervisor/proto/spooled.proto.

    python -m supervisor.proto.regenerate          # rewrite the stubs
    python -m supervisor.proto.regenerate --check  # exit 1 if they are stale

Needs grpcio-tools (the `grpc` extra's build half). The proto is compiled under the file name
`spooled.proto`, as the SDK's was, so both descriptor sets are byte-identical and load side by side.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
PROTO = HERE / "spooled.proto"
OUTPUTS = ("spooled_pb2.py", "spooled_pb2.pyi", "spooled_pb2_grpc.py")


def generate(out_dir: Path) -> dict[str, str]:
    """Run protoc (grpc_tools) into out_dir; return {file name: text}, with the grpc module's import made relative."""
    import grpc_tools
    from grpc_tools import protoc

    include = str(Path(grpc_tools.__file__).parent / "_proto")
    args = ["protoc", f"-I{PROTO.parent}", f"-I{include}", f"--python_out={out_dir}", f"--pyi_out={out_dir}",
            f"--grpc_python_out={out_dir}", str(PROTO)]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")
    texts = {name: (out_dir / name).read_text() for name in OUTPUTS}
    texts["spooled_pb2_grpc.py"] = texts["spooled_pb2_grpc.py"].replace(
        "import spooled_pb2 as spooled__pb2", "from . import spooled_pb2 as spooled__pb2")
    return texts


def main(argv: list[str]) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        texts = generate(Path(tmp))
    stale = [name for name, text in texts.items() if not (HERE / name).is_file() or (HERE / name).read_text() != text]
    if "--check" in argv:
        if stale:
            print("stale gRPC stubs: " + ", ".join(stale) + "; run python -m supervisor.proto.regenerate")
            return 1
        return 0
    for name in stale:
        (HERE / name).write_text(texts[name])
    print("regenerated: " + (", ".join(stale) or "nothing (already current)"))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
