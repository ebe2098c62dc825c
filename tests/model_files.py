"""Reading and rewriting the records inside saved files, checksums recomputed: what a crafted or
damaged file holds after it passes the checksum."""
import hashlib
import io
import json
import struct

import torch


def parts(content: bytes, signature: bytes) -> tuple[dict, bytes]:
    """A checksummed file's JSON header and its body bytes."""
    header_len = struct.unpack("<I", content[len(signature): len(signature) + 4])[0]
    start = len(signature) + 4
    return json.loads(content[start: start + header_len]), content[start + header_len:]


def payload(content: bytes, signature: bytes):
    return torch.load(io.BytesIO(parts(content, signature)[1]), weights_only=True)


def torch_bytes(obj) -> bytes:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


def with_body(content: bytes, signature: bytes, body: bytes) -> bytes:
    """``content`` with its body replaced, the header's size and checksum made to match."""
    header = parts(content, signature)[0]
    header.update(body_bytes=len(body), body_sha256=hashlib.sha256(body).hexdigest())
    header_bytes = json.dumps(header).encode()
    return signature + struct.pack("<I", len(header_bytes)) + header_bytes + body


def with_payload(content: bytes, signature: bytes, obj) -> bytes:
    return with_body(content, signature, torch_bytes(obj))
