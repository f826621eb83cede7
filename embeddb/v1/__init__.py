"""Generated gRPC stubs of the embeddb v1 API (from proto/, by proto/generate.py)."""
