"""Generated from the upstream api.proto; see api_pb2.py's header."""
