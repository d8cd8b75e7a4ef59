"""Model importers: turn a serialized model into the compiler's IR graph."""

from compiler.frontend.onnx import FrontendError, import_onnx

__all__ = ["FrontendError", "import_onnx"]
