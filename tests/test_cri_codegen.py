"""The committed cri/_generated modules are what `python -m cri.codegen` makes."""

from __future__ import annotations

import importlib
from pathlib import Path

from cri import codegen


def test_generated_code_is_not_stale(tmp_path: Path) -> None:
    fresh = codegen.generate(tmp_path)
    assert sorted(p.name for p in fresh) == ["__init__.py", "api_pb2.py", "api_pb2.pyi", "api_pb2_grpc.py"]
    stale = [p.name for p in fresh
             if not (codegen.OUTPUT_DIR / p.name).exists()
             or (codegen.OUTPUT_DIR / p.name).read_bytes() != p.read_bytes()]
    assert stale == [], f"cri/_generated is stale ({', '.join(stale)}): run `python -m cri.codegen`"


def test_check_mode_reports_staleness(tmp_path: Path) -> None:
    out = tmp_path / "generated"
    assert codegen.main(["--out", str(out)]) == 0
    assert codegen.main(["--check", "--out", str(out)]) == 0
    (out / "api_pb2.py").write_text("# edited\n")
    assert codegen.main(["--check", "--out", str(out)]) == 1


def test_generated_modules_live_in_the_cri_package() -> None:
    pb2 = importlib.import_module("cri._generated.api_pb2")
    grpc_module = importlib.import_module("cri._generated.api_pb2_grpc")
    assert pb2.ContainerConfig.__module__ == "cri._generated.api_pb2"
    assert grpc_module.runtime_dot_v1_dot_api__pb2 is pb2
    assert pb2.DESCRIPTOR.name == "runtime/v1/api.proto" and pb2.DESCRIPTOR.package == "runtime.v1"
    services = {s.full_name for s in pb2.DESCRIPTOR.services_by_name.values()}
    assert services == {"runtime.v1.RuntimeService", "runtime.v1.ImageService"}
