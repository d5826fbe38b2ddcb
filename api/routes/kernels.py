"""Registered kernels: their dimensions with bounds, dtypes and search space."""

from __future__ import annotations

from fastapi import APIRouter

from api.deps import ReadAccess
from api.schemas import DimPublic, KernelPublic, KernelsPublic
from search_spaces import get_kernel, kernel_names

router = APIRouter(prefix="/kernels", tags=["kernels"])


def kernel_public(name: str) -> KernelPublic:
    k = get_kernel(name)
    space = k.space()
    return KernelPublic(
        name=k.name, version=k.version, description=getattr(k, "description", ""),
        dims=[DimPublic(name=d.name, min=d.lo, max=d.hi, doc=d.doc) for d in k.dims],
        dtypes=list(k.dtypes), space=space.describe(), space_size=space.size())


@router.get("", response_model=KernelsPublic, dependencies=[ReadAccess])
def list_kernels() -> KernelsPublic:
    data = [kernel_public(n) for n in kernel_names()]
    return KernelsPublic(data=data, count=len(data))
