"""Protobuf schemas as the registry holds them (``.proto`` text) turned into message classes, and messages
into plain values.

A ``.proto`` text is compiled with ``protoc`` from ``grpcio-tools`` (in process, no binary to install), with
Google's well-known types (``google/protobuf/timestamp.proto`` …) on its import path. A schema given as a
base64 ``FileDescriptorProto`` (what Confluent's Python serializer registers) is read directly.
"""

import base64
import contextlib
import importlib.resources
import io
import tempfile
from datetime import timezone
from pathlib import Path

from google.protobuf import descriptor_pb2, descriptor_pool, json_format, message_factory

_TIMESTAMP = "google.protobuf.Timestamp"


def compile_proto(text: str, name: str = "schema.proto") -> descriptor_pb2.FileDescriptorSet:
    """The descriptor set of ``text`` and what it imports; ValueError with protoc's message if it is not valid."""
    from grpc_tools import protoc

    with tempfile.TemporaryDirectory(prefix="kdg-proto-") as tmp:
        src, out = Path(tmp) / name, Path(tmp) / "out.pb"
        src.write_text(text, encoding="utf-8")
        includes = str(importlib.resources.files("grpc_tools") / "_proto")
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            rc = protoc.main(["protoc", f"-I{tmp}", f"-I{includes}", "--include_imports",
                              f"--descriptor_set_out={out}", str(src)])
        if rc != 0 or not out.exists():
            said = err.getvalue().strip()
            raise ValueError(f"not a valid .proto schema: protoc exited {rc}" + (f": {said}" if said else ""))
        return descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())


def _descriptor_set(text: str) -> descriptor_pb2.FileDescriptorSet:
    if "message" not in text:  # maybe a base64 FileDescriptorProto
        try:
            fd = descriptor_pb2.FileDescriptorProto.FromString(base64.b64decode(text, validate=True))
        except Exception:  # binascii.Error, or protobuf's DecodeError: not a descriptor, so .proto text
            fd = None
        if fd is not None and fd.message_type:
            return descriptor_pb2.FileDescriptorSet(file=[fd])
    return compile_proto(text)


class ProtoFile:
    """One schema's file: its messages, by the indexes the wire format names them with."""

    def __init__(self, text: str):
        fds = _descriptor_set(text)
        pool = descriptor_pool.DescriptorPool()
        for fd in fds.file:
            pool.Add(fd)
        self.file = pool.FindFileByName(fds.file[-1].name)
        if not self.file.message_types_by_name:
            raise ValueError("the .proto schema declares no message")
        self._classes: dict[tuple[int, ...], type] = {}

    def message(self, indexes: tuple[int, ...] = (0,)):
        """The message class at ``indexes`` (the first top-level message is ``(0,)``)."""
        cls = self._classes.get(indexes)
        if cls is None:
            desc, types = None, list(self.file.message_types_by_name.values())
            for index in indexes:
                if index >= len(types):
                    raise ValueError(f"the schema has no message at indexes {list(indexes)}")
                desc = types[index]
                types = list(desc.nested_types)
            cls = self._classes[indexes] = message_factory.GetMessageClass(desc)
        return cls


def message_values(msg) -> dict:
    """A message as a dict of plain values: every field (an unset proto3 scalar is its default, an unset
    message or optional field None), enums by name, bytes as bytes, Timestamps as UTC datetimes."""
    out = {}
    for field in msg.DESCRIPTOR.fields:
        repeated = field.is_repeated if hasattr(field, "is_repeated") else field.label == field.LABEL_REPEATED
        if not repeated and field.has_presence and not msg.HasField(field.name):
            out[field.name] = None
            continue
        value = getattr(msg, field.name)
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            value_field = field.message_type.fields_by_name["value"]
            out[field.name] = {k: _value(value_field, v) for k, v in value.items()}
        elif repeated:
            out[field.name] = [_value(field, v) for v in value]
        else:
            out[field.name] = _value(field, value)
    return out


def _value(field, value):
    if field.enum_type is not None:
        found = field.enum_type.values_by_number.get(value)
        return found.name if found is not None else value
    if field.message_type is None:
        return value
    if field.message_type.full_name == _TIMESTAMP:
        return value.ToDatetime(tzinfo=timezone.utc)
    if field.message_type.full_name.startswith("google.protobuf."):
        return json_format.MessageToDict(value)
    return message_values(value)
