"""Trace Triton's compiles across processes (see ``sitecustomize.py``)."""
