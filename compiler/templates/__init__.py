"""The kernel library: one module per template, looked up by AutoTVM's template name."""

from __future__ import annotations

from compiler.templates import (
    conv2d_nchw,
    conv2d_nchw_int8,
    conv2d_nchwc,
    conv2d_nchwc_1x1,
    conv2d_nchwc_gemm,
    conv2d_nchwc_winograd,
    conv2d_winograd,
    dense_large_batch,
    dense_pack,
    dense_small_batch,
    depthwise_conv2d,
)
from compiler.templates.base import (
    Buffer,
    ConfigError,
    Epilogue,
    IOLayout,
    Kernel,
    Prologue,
    Stage,
    Template,
    WorkloadError,
)
from compiler.templates.space import ConfigSpace

_REGISTRY: dict[str, Template] = {
    t.name: t
    for t in (conv2d_nchw.TEMPLATE, dense_small_batch.TEMPLATE, dense_large_batch.TEMPLATE)
}
_REGISTRY[dense_pack.TEMPLATE.name] = dense_pack.TEMPLATE
_REGISTRY[conv2d_nchwc.TEMPLATE.name] = conv2d_nchwc.TEMPLATE
_REGISTRY[conv2d_winograd.TEMPLATE.name] = conv2d_winograd.TEMPLATE
_REGISTRY[conv2d_nchwc_winograd.TEMPLATE.name] = conv2d_nchwc_winograd.TEMPLATE
_REGISTRY[conv2d_nchwc_1x1.TEMPLATE.name] = conv2d_nchwc_1x1.TEMPLATE
_REGISTRY[conv2d_nchwc_gemm.TEMPLATE.name] = conv2d_nchwc_gemm.TEMPLATE
_REGISTRY[conv2d_nchw_int8.TEMPLATE.name] = conv2d_nchw_int8.TEMPLATE
_REGISTRY["conv2d_nchw_int8"] = conv2d_nchw_int8.TEMPLATE  # TVM's name without .cuda
_REGISTRY[depthwise_conv2d.TEMPLATE.name] = depthwise_conv2d.TEMPLATE


class UnknownTemplateError(KeyError):
    def __str__(self) -> str:
        return (f"unknown template {self.args[0]!r}; known: {', '.join(sorted(_REGISTRY))}")


def get_template(name: str) -> Template:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise UnknownTemplateError(name) from None


def register_template(template: Template) -> None:
    """Add a template (tests register deliberately broken ones this way)."""
    _REGISTRY[template.name] = template


__all__ = [
    "Buffer",
    "ConfigError",
    "ConfigSpace",
    "Epilogue",
    "IOLayout",
    "Kernel",
    "Prologue",
    "Stage",
    "Template",
    "UnknownTemplateError",
    "WorkloadError",
    "get_template",
    "register_template",
]
