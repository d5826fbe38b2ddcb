"""Registered kernels: their dimensions with bounds, dtypes and search space."""

from __future__ import annotations

from fastapi import APIRouter

from api.deps import ReadAccess
from api.schemas import DimPublic, KernelPublic, KernelsPublic, PluginErrorPublic
from search_spaces import get_kernel, is_builtin, kernel_names, plugin_errors
from tuner.errors import UnknownKernel
from tuner.kernel import verification_of

router = APIRouter(prefix="/kernels", tags=["kernels"])


def kernel_public(name: str) -> KernelPublic:
    k = get_kernel(name)
    space = k.space()
    return KernelPublic(
        name=k.name, version=k.version, description=k.description,
        source="builtin" if is_builtin(name) else "plugin", ref=k.ref,
        dims=[DimPublic(name=d.name, min=d.lo, max=d.hi, doc=d.doc) for d in k.dims],
        dtypes=list(k.dtypes), space=space.describe(), space_size=space.size(),
        verification=verification_of(k))


def registered_verification(name: str) -> str | None:
    """How the kernel registered as ``name`` checks its configs (``verification_of``); None
    when no kernel of that name is registered in this process (a job or config of a plugin
    this service does not load): unknown, not assumed verified."""
    try:
        return verification_of(get_kernel(name))
    except UnknownKernel:
        return None


@router.get("", response_model=KernelsPublic, dependencies=[ReadAccess])
def list_kernels() -> KernelsPublic:
    """Every registered kernel (built-in and plugin), and the plugins that failed to load."""
    data = [kernel_public(n) for n in kernel_names()]
    errors = [PluginErrorPublic(**e.to_dict()) for e in plugin_errors()]
    return KernelsPublic(data=data, count=len(data), errors=errors)
