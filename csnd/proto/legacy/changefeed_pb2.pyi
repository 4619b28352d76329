from csnd.proto.changefeed.v1 import changefeed_pb2 as _changefeed_pb2
from google.protobuf import descriptor as _descriptor
from typing import ClassVar as _ClassVar

DESCRIPTOR: _descriptor.FileDescriptor
