"""Reductions: ReduceMean / ReduceMax / ReduceSum ... and global max pooling."""

from __future__ import annotations

from compiler.frontend.onnx.importer import Converter

CONVERTERS: dict[str, Converter] = {}
