"""Generated from the upstream api.proto beside this file; see api_pb2.py's header."""
