"""The few CRI calls devenv needs, made without generated protobuf stubs.

devenv must not depend on the project's `cri` package (the environment has to
work before, and independently of, the code it tests), so the handful of
messages used here -- all flat, with string ids -- are encoded and decoded by
hand with grpcio's generic unary calls, which pass raw bytes when no
serializer is given.
"""

from __future__ import annotations

from collections.abc import Iterator

import grpc

RUNTIME = "/runtime.v1.RuntimeService/"
IMAGES = "/runtime.v1.ImageService/"


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7


def fields(data: bytes) -> Iterator[tuple[int, int | bytes]]:
    """Top-level (field number, value) pairs of a protobuf message."""
    pos = 0
    while pos < len(data):
        key, pos = _varint(data, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(data, pos)
            yield number, value
        elif wire == 2:
            size, pos = _varint(data, pos)
            yield number, data[pos:pos + size]
            pos += size
        elif wire == 1:
            yield number, data[pos:pos + 8]
            pos += 8
        elif wire == 5:
            yield number, data[pos:pos + 4]
            pos += 4
        else:
            raise ValueError(f"unsupported protobuf wire type {wire}")


def _encode_varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def bytes_field(number: int, raw: bytes) -> bytes:
    """A length-delimited field: bytes, a string or an embedded message."""
    return _encode_varint(number << 3 | 2) + _encode_varint(len(raw)) + raw


def string_field(number: int, value: str) -> bytes:
    return bytes_field(number, value.encode())


def _strings(data: bytes, number: int) -> list[str]:
    return [v.decode() for n, v in fields(data) if n == number and isinstance(v, bytes)]


class RawCRI:
    """A blocking CRI client for the calls devenv itself needs."""

    def __init__(self, socket_path: str) -> None:
        self.channel = grpc.insecure_channel("unix://" + socket_path)

    def close(self) -> None:
        self.channel.close()

    def __enter__(self) -> RawCRI:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def call(self, method: str, request: bytes = b"", timeout: float = 10.0) -> bytes:
        """One unary call; `method` is the full path, e.g. RUNTIME + "Version"."""
        stub = self.channel.unary_unary(method)  # no (de)serializer: raw bytes
        response: bytes = stub(request, timeout=timeout)
        return response

    def version(self, timeout: float = 2.0) -> dict[str, str]:
        """VersionResponse: version, runtime_name, runtime_version, runtime_api_version."""
        names = {1: "version", 2: "runtime_name", 3: "runtime_version", 4: "runtime_api_version"}
        raw = self.call(RUNTIME + "Version", timeout=timeout)
        return {names[n]: v.decode() for n, v in fields(raw)
                if n in names and isinstance(v, bytes)}

    def image_tags(self) -> list[str]:
        """Every repo tag the CRI image service knows (ListImagesResponse.images[].repo_tags)."""
        raw = self.call(IMAGES + "ListImages")
        tags: list[str] = []
        for n, image in fields(raw):
            if n == 1 and isinstance(image, bytes):
                tags.extend(_strings(image, 2))
        return tags

    def image_fs_used_bytes(self) -> int:
        """Bytes used by the image filesystem as CRI reports them (ImageFsInfo),
        i.e. image_filesystems[0].used_bytes.value; 0 before the first sweep."""
        raw = self.call(IMAGES + "ImageFsInfo")
        for n, usage in fields(raw):
            if n == 1 and isinstance(usage, bytes):
                used = dict(fields(usage)).get(3, b"")
                value = dict(fields(used)).get(1, 0) if isinstance(used, bytes) else 0
                return value if isinstance(value, int) else 0
        return 0

    def pod_ids(self) -> list[str]:
        """Ids of all pod sandboxes (ListPodSandboxResponse.items[].id)."""
        raw = self.call(RUNTIME + "ListPodSandbox")
        return [_strings(item, 1)[0] for n, item in fields(raw)
                if n == 1 and isinstance(item, bytes)]

    def remove_all_pods(self, timeout: float = 30.0) -> list[str]:
        """Stop and remove every pod sandbox, all at once; return the ids.

        Going through CRI (instead of killing processes) runs the CNI DEL of
        each pod, which releases its IP, veth and portmap rules.
        """
        ids = self.pod_ids()
        for method in ("StopPodSandbox", "RemovePodSandbox"):
            stub = self.channel.unary_unary(RUNTIME + method)
            futures = [stub.future(string_field(1, pod), timeout=timeout) for pod in ids]
            for future in futures:
                try:
                    future.result()
                except grpc.RpcError:
                    pass  # best effort: the forced cleanup after it handles leftovers
        return ids
