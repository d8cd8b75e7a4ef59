"""Image operators: Resize / Upsample, DepthToSpace, SpaceToDepth."""

from __future__ import annotations

from compiler.frontend.onnx.importer import Converter

CONVERTERS: dict[str, Converter] = {}
