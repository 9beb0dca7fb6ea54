"""Generating Python from our own .proto subsets, for the protocols that are not CRI (cri/ has
its own codegen): protoc names modules after the proto's path ("dra/v1/api.proto" becomes
``dra.v1.api_pb2``), which we keep because it is the name registered in protobuf's global
descriptor pool (several files called "api.proto" would collide), and we rewrite the places
where that module name leaks into generated code. The output is flattened into
``<package>/_generated/<api>_<version>_pb2{.py,.pyi,_grpc.py}``.

Each protocol's package has a few-line ``codegen`` module that names its protos and calls
:class:`ProtoSet`; ``--check`` regenerates into a temporary directory and exits 1 when the
committed files differ (a test does the same).
"""

from __future__ import annotations

import argparse
import filecmp
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class ProtoSet:
    proto_root: Path
    output_dir: Path
    output_package: str
    protos: Mapping[str, str]
    """proto path (relative to proto_root) → the flat module name of its stubs."""
    init_doc: str
    """The generated package's docstring: who generated it, who may import it."""
    command: str
    """How to run this set's codegen (for messages)."""

    def _rewrites(self, proto: str, module: str) -> list[tuple[str, str]]:
        protoc_package = proto.removesuffix(".proto").replace("/", ".")  # dra.v1.api
        parent, leaf = protoc_package.rsplit(".", 1)
        return [
            (f"from {parent} import {leaf}_pb2 as", f"from {self.output_package} import {module}_pb2 as"),
            (f"'{protoc_package}_pb2'", f"'{self.output_package}.{module}_pb2'"),
        ]

    def generate(self, out_dir: Path) -> list[Path]:
        """Run protoc on the committed protos and write the fixed-up modules to out_dir."""
        from grpc_tools import protoc  # type: ignore[import-untyped]  # test extra: import lazily

        out_dir.mkdir(parents=True, exist_ok=True)
        written = [_write(out_dir / "__init__.py", f'"""{self.init_doc}"""\n')]
        with tempfile.TemporaryDirectory(prefix="protogen-") as raw:
            include = Path(protoc.__file__).resolve().parent / "_proto"
            args = ["grpc_tools.protoc", f"-I{self.proto_root}", f"-I{include}", f"--python_out={raw}",
                    f"--pyi_out={raw}", f"--grpc_python_out={raw}", *(str(self.proto_root / p) for p in self.protos)]
            status = protoc.main(args)
            if status != 0:
                raise RuntimeError(f"protoc failed with status {status}: {' '.join(args)}")
            for proto, module in self.protos.items():
                stem = proto.removesuffix(".proto")
                for suffix in ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py"):
                    text = (Path(raw) / f"{stem}{suffix}").read_text(encoding="utf-8")
                    for old, new in self._rewrites(proto, module):
                        text = text.replace(old, new)
                    written.append(_write(out_dir / f"{module}{suffix}", text))
        return written

    def stale_files(self, committed: Path | None = None) -> list[str]:
        """Names of generated files that differ from a fresh generation (or are missing)."""
        committed = committed or self.output_dir
        with tempfile.TemporaryDirectory(prefix="protogen-check-") as tmp:
            return [p.name for p in self.generate(Path(tmp))
                    if not (committed / p.name).exists() or not filecmp.cmp(p, committed / p.name, shallow=False)]

    def main(self, argv: Sequence[str] | None = None) -> int:
        parser = argparse.ArgumentParser(prog=self.command, description=f"Regenerate {self.output_dir}")
        parser.add_argument("--check", action="store_true", help="only report whether the generated code is stale")
        parser.add_argument("--out", type=Path, default=self.output_dir, help="output directory")
        options = parser.parse_args(argv)
        if options.check:
            stale = self.stale_files(options.out)
            if stale:
                print(f"stale generated files in {options.out}: {', '.join(stale)}; run `{self.command}`")
                return 1
            print(f"{options.out} is up to date")
            return 0
        for path in self.generate(options.out):
            print(f"wrote {path}")
        return 0


def _write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


__all__ = ["ProtoSet"]
